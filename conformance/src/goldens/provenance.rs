//! The provenance record of a golden: a `<name>.provenance.json` sidecar next to the files it
//! covers (format documented in goldens/README.md, "Provenance records").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::GoldenError;

/// Schema tag every sidecar carries; bump when a field's meaning changes.
pub const SCHEMA: &str = "ds41-golden-provenance/1";
/// File-name suffix of a sidecar.
pub const SIDECAR_SUFFIX: &str = ".provenance.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub schema: String,
    /// One sentence: what these goldens are and what checks them.
    pub description: String,
    pub generator: Generator,
    /// The exact command that made the outputs, run from the repository root. Placeholders:
    /// `{out}` = the directory the outputs are written to, `{input:NAME}` = the path of input
    /// NAME; a leading `ds41` is the `ds41` binary itself.
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<Synthetic>,
    #[serde(default)]
    pub inputs: Vec<Input>,
    pub outputs: Vec<Output>,
    /// Errata behaviours these goldens embody: errata id -> behaviour name (goldens/errata.yaml).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generator {
    pub kind: GeneratorKind,
    /// Tool or engine name, e.g. `ds41-reference`, `tokenizers`, `inference/model.py`.
    pub name: String,
    pub version: String,
    /// Source revision (git commit, release revision) when the version alone is ambiguous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Anything else that influenced the bytes (python, torch, threads, platform, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GeneratorKind {
    /// This repository's reference engine (`ds41 ...`); `ds41 goldens bless` rewrites these.
    ReferenceEngine,
    /// A third-party tool run on upstream data (HF `tokenizers`, ...): `goldens/regen/`.
    UpstreamTool,
    /// The official release code (`inference/model.py`, `encoding/encoding.py`): `goldens/regen/`.
    OfficialCode,
    /// Another project's oracle (the WASTE `tools/ds41_ref.py`): `goldens/regen/`.
    OracleCode,
    /// Written by hand (the command then names how it was verified).
    HandWritten,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Synthetic {
    pub preset: String,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Name used by `{input:NAME}` in the command.
    pub name: String,
    pub location: Location,
    /// Relative to the location's root (repository root, `$DS41_UPSTREAM`, the release
    /// snapshot, the external
    /// tree's root); for `generated`, a label.
    pub path: String,
    /// sha256 of the file, or the tree hash of a directory (hashing.rs).
    pub sha256: String,
    /// `generated` inputs only: the command that makes it in `{out}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Location {
    /// In this repository; always verified.
    Repo,
    /// Below `$DS41_UPSTREAM`; verified when it is set, else reported as skipped.
    Upstream,
    /// A file of the DeepSeek-V4.1-Flash release snapshot (`DS41_RELEASE` or the Hugging
    /// Face hub cache, crate::locations); verified when one is found, else reported as skipped.
    Release,
    /// Outside both (a release checkout, a WASTE checkout): recorded, not verifiable here.
    External,
    /// Produced by `command` (e.g. `ds41 synth`); verified by `goldens check --deep`.
    Generated,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// Relative to the sidecar's directory.
    pub path: String,
    /// `null` = declared but never blessed (check fails until `goldens bless` fills it).
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl Provenance {
    /// Read and validate a sidecar; every error names the file and the field.
    pub fn load(path: &Path) -> Result<Provenance, GoldenError> {
        let text = std::fs::read_to_string(path).map_err(|e| GoldenError::io(path, e))?;
        let record: Provenance = serde_json::from_str(&text).map_err(|e| GoldenError::Parse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        record.validate(path)?;
        Ok(record)
    }

    /// Pretty JSON with a trailing newline (stable bytes: fields in declaration order).
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("provenance serialises");
        text.push('\n');
        text
    }

    pub fn save(&self, path: &Path) -> Result<(), GoldenError> {
        std::fs::write(path, self.to_json()).map_err(|e| GoldenError::io(path, e))
    }

    pub fn validate(&self, path: &Path) -> Result<(), GoldenError> {
        let field = |field: String, reason: String| GoldenError::Field {
            path: path.to_path_buf(),
            field,
            reason,
        };
        if self.schema != SCHEMA {
            return Err(field(
                "schema".into(),
                format!("expected `{SCHEMA}`, found `{}`", self.schema),
            ));
        }
        for (name, value) in [
            ("description", &self.description),
            ("command", &self.command),
            ("generator.name", &self.generator.name),
            ("generator.version", &self.generator.version),
        ] {
            if value.trim().is_empty() {
                return Err(field(name.into(), "must not be empty".into()));
            }
        }
        if self.outputs.is_empty() {
            return Err(field("outputs".into(), "lists no file".into()));
        }
        let mut seen = BTreeSet::new();
        for (i, out) in self.outputs.iter().enumerate() {
            check_relative(&out.path).map_err(|r| field(format!("outputs[{i}].path"), r))?;
            if !seen.insert(out.path.as_str()) {
                return Err(field(
                    format!("outputs[{i}].path"),
                    format!("`{}` listed twice", out.path),
                ));
            }
            if let Some(h) = &out.sha256 {
                check_hex(h).map_err(|r| field(format!("outputs[{i}].sha256"), r))?;
            }
        }
        let mut names = BTreeSet::new();
        for (i, input) in self.inputs.iter().enumerate() {
            if !names.insert(input.name.as_str()) {
                return Err(field(
                    format!("inputs[{i}].name"),
                    format!("`{}` listed twice", input.name),
                ));
            }
            check_hex(&input.sha256).map_err(|r| field(format!("inputs[{i}].sha256"), r))?;
            if input.location != Location::External && input.location != Location::Generated {
                check_relative(&input.path).map_err(|r| field(format!("inputs[{i}].path"), r))?;
            }
            match (input.location, &input.command) {
                (Location::Generated, None) => {
                    return Err(field(
                        format!("inputs[{i}].command"),
                        "a generated input needs the command that makes it".into(),
                    ))
                }
                (Location::Generated, Some(c)) if !c.contains("{out}") => {
                    return Err(field(
                        format!("inputs[{i}].command"),
                        "must write to `{out}`".into(),
                    ))
                }
                (l, Some(_)) if l != Location::Generated => {
                    return Err(field(
                        format!("inputs[{i}].command"),
                        "only generated inputs have a command".into(),
                    ))
                }
                _ => {}
            }
        }
        for placeholder in placeholders(&self.command) {
            if let Some(name) = placeholder.strip_prefix("input:") {
                if !names.contains(name) {
                    return Err(field(
                        "command".into(),
                        format!("`{{{placeholder}}}` names no input"),
                    ));
                }
            } else if placeholder != "out" {
                return Err(field(
                    "command".into(),
                    format!("unknown placeholder `{{{placeholder}}}`"),
                ));
            }
        }
        Ok(())
    }

    /// Absolute paths of the outputs, given the sidecar's own path.
    pub fn output_paths(&self, sidecar: &Path) -> Vec<PathBuf> {
        let dir = sidecar.parent().unwrap_or(Path::new("."));
        self.outputs.iter().map(|o| dir.join(&o.path)).collect()
    }
}

/// The `{...}` placeholders of a command template, in order.
pub fn placeholders(command: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = command;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end) => {
                found.push(&after[..end]);
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    found
}

fn check_hex(value: &str) -> Result<(), String> {
    if value.len() == 64
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        Ok(())
    } else {
        Err(format!("`{value}` is not 64 lower-case hex digits"))
    }
}

fn check_relative(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if path.is_empty() || p.is_absolute() || p.components().any(|c| c.as_os_str() == "..") {
        Err(format!(
            "`{path}` must be a relative path without `..` components"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> Provenance {
        Provenance {
            schema: SCHEMA.into(),
            description: "d".into(),
            generator: Generator {
                kind: GeneratorKind::ReferenceEngine,
                name: "ds41-reference".into(),
                version: "0.1.0".into(),
                revision: None,
                environment: BTreeMap::new(),
            },
            command: "ds41 forward --model {input:model} --out {out}/t.safetensors".into(),
            synthetic: Some(Synthetic {
                preset: "tiny".into(),
                seed: 1,
            }),
            inputs: vec![Input {
                name: "model".into(),
                location: Location::Generated,
                path: "tiny-seed1".into(),
                sha256: "0".repeat(64),
                command: Some("ds41 synth --preset tiny --seed 1 --out {out}".into()),
            }],
            outputs: vec![Output {
                path: "t.safetensors".into(),
                sha256: None,
                bytes: None,
            }],
            errata: BTreeMap::new(),
        }
    }

    #[test]
    fn round_trips_through_json() {
        let p = minimal();
        let back: Provenance = serde_json::from_str(&p.to_json()).unwrap();
        assert_eq!(back, p);
        back.validate(Path::new("x")).unwrap();
    }

    #[test]
    fn rejects_bad_fields_naming_them() {
        let mut p = minimal();
        p.command = "ds41 forward --model {input:nope}".into();
        let err = p.validate(Path::new("f.provenance.json")).unwrap_err();
        assert!(err.to_string().contains("command"), "{err}");
        assert!(err.to_string().contains("f.provenance.json"), "{err}");

        let mut p = minimal();
        p.outputs[0].sha256 = Some("ABC".into());
        let err = p.validate(Path::new("f")).unwrap_err().to_string();
        assert!(err.contains("outputs[0].sha256"), "{err}");

        let mut p = minimal();
        p.outputs[0].path = "../escape".into();
        let err = p.validate(Path::new("f")).unwrap_err().to_string();
        assert!(err.contains("outputs[0].path"), "{err}");

        let mut p = minimal();
        p.inputs[0].command = None;
        let err = p.validate(Path::new("f")).unwrap_err().to_string();
        assert!(err.contains("inputs[0].command"), "{err}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let mut v: serde_json::Value = serde_json::from_str(&minimal().to_json()).unwrap();
        v["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Provenance>(v).is_err());
    }
}
