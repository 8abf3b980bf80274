//! The errata register (goldens/errata.yaml, described in goldens/ERRATA.md): places where the
//! official code is wrong or under-specified, the behaviours a case can ask for, and the goldens
//! that exist for each. A conformance case names `errata: {<id>: <behaviour>}`; the harness
//! resolves it with [`Errata::behaviour`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::GoldenError;

pub const SCHEMA: &str = "ds41-errata/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Errata {
    pub schema: String,
    pub errata: Vec<Erratum>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Erratum {
    /// Stable id (`[a-z0-9_]+`) that cases reference.
    pub id: String,
    pub title: String,
    pub class: ErratumClass,
    /// Spec sections that define it, e.g. `MODEL.md §8`.
    pub spec: Vec<String>,
    pub summary: String,
    /// Behaviour the official code has; `null` when it has no defined one (e.g. tie order).
    pub as_shipped: Option<String>,
    /// Behaviour this project takes as correct / canonical.
    pub corrected: String,
    /// Behaviour a case gets when it does not name one.
    pub default: String,
    /// When the behaviours give different results.
    pub visible_when: String,
    pub behaviours: Vec<Behaviour>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErratumClass {
    /// The official code computes something its own design does not intend.
    Defect,
    /// The official code leaves the result to the platform (reduction order, tie order).
    Underspecified,
    /// A second oracle (WASTE) differs from the official code.
    OracleDifference,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Behaviour {
    pub name: String,
    pub description: String,
    /// How to select it in the reference engine (`ds41` flags), if it can be selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Goldens that embody it: `upstream:<path below $DS41_UPSTREAM>` or `repo:<path>`.
    #[serde(default)]
    pub goldens: Vec<String>,
}

impl ErratumClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErratumClass::Defect => "defect",
            ErratumClass::Underspecified => "underspecified",
            ErratumClass::OracleDifference => "oracle-difference",
        }
    }
}

/// Where a golden reference points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoldenRef {
    Upstream(String),
    Repo(String),
}

impl GoldenRef {
    pub fn parse(text: &str) -> Option<GoldenRef> {
        let (scheme, path) = text.split_once(':')?;
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c == "..") {
            return None;
        }
        match scheme {
            "upstream" => Some(GoldenRef::Upstream(path.to_string())),
            "repo" => Some(GoldenRef::Repo(path.to_string())),
            _ => None,
        }
    }

    /// The file it names, or `None` for an upstream ref when `$DS41_UPSTREAM` is unknown.
    pub fn resolve(&self, repo_root: &Path, upstream: Option<&Path>) -> Option<PathBuf> {
        match self {
            GoldenRef::Repo(p) => Some(repo_root.join(p)),
            GoldenRef::Upstream(p) => upstream.map(|u| u.join(p)),
        }
    }
}

impl Errata {
    pub fn load(path: &Path) -> Result<Errata, GoldenError> {
        let text = std::fs::read_to_string(path).map_err(|e| GoldenError::io(path, e))?;
        let errata: Errata = serde_yaml::from_str(&text).map_err(|e| GoldenError::Parse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        errata.validate(path)?;
        Ok(errata)
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
        let mut ids = BTreeSet::new();
        for (i, e) in self.errata.iter().enumerate() {
            let at = |f: &str| format!("errata[{i}] ({}).{f}", e.id);
            if e.id.is_empty()
                || !e
                    .id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(field(at("id"), "must match [a-z0-9_]+".into()));
            }
            if !ids.insert(e.id.as_str()) {
                return Err(field(at("id"), "duplicate id".into()));
            }
            if e.behaviours.len() < 2 {
                return Err(field(
                    at("behaviours"),
                    "an erratum needs at least two behaviours".into(),
                ));
            }
            let mut names = BTreeSet::new();
            for (j, b) in e.behaviours.iter().enumerate() {
                if !names.insert(b.name.as_str()) {
                    return Err(field(
                        at(&format!("behaviours[{j}].name")),
                        format!("duplicate behaviour `{}`", b.name),
                    ));
                }
                for (k, g) in b.goldens.iter().enumerate() {
                    if GoldenRef::parse(g).is_none() {
                        return Err(field(
                            at(&format!("behaviours[{j}].goldens[{k}]")),
                            format!("`{g}` is not `upstream:<path>` or `repo:<path>`"),
                        ));
                    }
                }
            }
            let named = [
                ("as_shipped", e.as_shipped.as_deref()),
                ("corrected", Some(e.corrected.as_str())),
                ("default", Some(e.default.as_str())),
            ];
            for (f, value) in named {
                if let Some(v) = value {
                    if !names.contains(v) {
                        return Err(field(at(f), format!("`{v}` is not one of its behaviours")));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<&Erratum> {
        self.errata.iter().find(|e| e.id == id)
    }

    /// Resolve a case's `errata: {id: behaviour}` entry; the error says what exists.
    pub fn behaviour(&self, id: &str, name: &str) -> Result<&Behaviour, String> {
        let erratum = self.get(id).ok_or_else(|| {
            let known: Vec<_> = self.errata.iter().map(|e| e.id.as_str()).collect();
            format!("unknown erratum `{id}` (known: {})", known.join(", "))
        })?;
        erratum
            .behaviours
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| {
                let known: Vec<_> = erratum.behaviours.iter().map(|b| b.name.as_str()).collect();
                format!(
                    "erratum `{id}` has no behaviour `{name}` (known: {})",
                    known.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
schema: ds41-errata/1
errata:
  - id: index_k_handoff
    title: t
    class: defect
    spec: ["MODEL.md §8"]
    summary: s
    as_shipped: as-shipped
    corrected: owner
    default: as-shipped
    visible_when: v
    behaviours:
      - name: as-shipped
        description: d
        engine: "--index-k as-shipped"
        goldens: ["upstream:official_a/p01_d47/golden_ref_defect.safetensors"]
      - name: owner
        description: d
"#;

    #[test]
    fn loads_and_resolves() {
        let e: Errata = serde_yaml::from_str(SAMPLE).unwrap();
        e.validate(Path::new("errata.yaml")).unwrap();
        assert_eq!(
            e.behaviour("index_k_handoff", "owner").unwrap().name,
            "owner"
        );
        let err = e.behaviour("index_k_handoff", "fixed").unwrap_err();
        assert!(err.contains("as-shipped, owner"), "{err}");
        assert!(e.behaviour("nope", "owner").is_err());
    }

    #[test]
    fn rejects_dangling_default_naming_the_field() {
        let text = SAMPLE.replace("default: as-shipped", "default: fixed");
        let e: Errata = serde_yaml::from_str(&text).unwrap();
        let err = e
            .validate(Path::new("errata.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("errata[0] (index_k_handoff).default"), "{err}");
    }

    #[test]
    fn golden_refs_parse_strictly() {
        assert_eq!(
            GoldenRef::parse("repo:goldens/a.json"),
            Some(GoldenRef::Repo("goldens/a.json".into()))
        );
        assert_eq!(GoldenRef::parse("upstream:../etc/passwd"), None);
        assert_eq!(GoldenRef::parse("http:x"), None);
    }
}
