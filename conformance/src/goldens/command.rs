//! Running a provenance command template (`{out}`, `{input:NAME}`, leading `ds41`) — used by
//! `goldens bless` to regenerate reference-engine goldens and by `goldens check --deep` to
//! rebuild generated inputs (synthetic checkpoints) and compare their hashes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::GoldenError;

/// Substitute the placeholders; every substituted path is single-quoted for `sh`.
pub fn expand(
    template: &str,
    out: &Path,
    inputs: &BTreeMap<String, PathBuf>,
    ds41: &Path,
) -> Result<String, String> {
    let mut text = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        text.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed `{{` in `{template}`"))?;
        let key = &after[..end];
        let value = if key == "out" {
            out.to_path_buf()
        } else if let Some(name) = key.strip_prefix("input:") {
            inputs
                .get(name)
                .cloned()
                .ok_or_else(|| format!("input `{name}` is not available"))?
        } else {
            return Err(format!("unknown placeholder `{{{key}}}`"));
        };
        text.push_str(&shell_quote(&value.to_string_lossy()));
        rest = &after[end + 1..];
    }
    text.push_str(rest);
    if let Some(tail) = text.strip_prefix("ds41 ") {
        text = format!("{} {tail}", shell_quote(&ds41.to_string_lossy()));
    }
    Ok(text)
}

pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Run an expanded command with `sh -c` from `cwd`; a non-zero exit is an error carrying the
/// command and the tail of its stderr (never swallowed).
pub fn run(command: &str, cwd: &Path, context: &Path) -> Result<(), GoldenError> {
    let output = Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .output()
        .map_err(|e| GoldenError::io(Path::new("sh"), e))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(GoldenError::Command {
        path: context.to_path_buf(),
        command: command.to_string(),
        reason: format!("{} — stderr:\n{}", output.status, tail.join("\n")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_placeholders_and_the_ds41_binary() {
        let mut inputs = BTreeMap::new();
        inputs.insert("model".to_string(), PathBuf::from("/tmp/my model"));
        let cmd = expand(
            "ds41 forward --model {input:model} --out {out}/t.safetensors",
            Path::new("/o"),
            &inputs,
            Path::new("/bin/ds41"),
        )
        .unwrap();
        assert_eq!(
            cmd,
            "/bin/ds41 forward --model '/tmp/my model' --out /o/t.safetensors"
        );
        assert!(expand("x {input:none}", Path::new("/o"), &inputs, Path::new("d")).is_err());
    }

    #[test]
    fn failing_command_reports_its_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let err = run(
            "echo boom >&2; exit 3",
            dir.path(),
            Path::new("g.provenance.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("boom") && err.contains("g.provenance.json"),
            "{err}"
        );
    }
}
