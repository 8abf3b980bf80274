//! The case schema (CONTRACT.md §1): cases are YAML data in `conformance/cases/<family>/*.yaml`,
//! one file per group, validated strictly on load (unknown fields refused, errors naming the
//! file, the case and the field path). A case's full name is `family::file::case`, stable, and
//! usable back as a filter.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize};

pub use crate::families::dsml::{DsmlSpec, ParseSpec, ProbeFiles, RenderSpec};
pub use crate::families::engram::{EngramGolden, EngramRelation, EngramSpec, WeightlessModel};
pub use crate::families::loader::{LoadExpect, LoaderSpec};
pub use crate::families::residual::{GoldenSpec, ResidualSpec};
pub use crate::families::state::{Relation, StateSpec};
pub use crate::families::tokenizer::{ExpectedIds, TokenizerCheck, TokenizerSpec};
pub use crate::families::{Family, Spec};
use crate::gates::{GateOverrides, ProfileName};

/// Where a model comes from: `synthetic:PRESET/LAYOUT[@SEED]`, `mutant:PRESET/LAYOUT/NAME`,
/// or `upstream:REL` (under DS41_UPSTREAM).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ModelRef {
    Synthetic {
        preset: String,
        layout: String,
        seed: u64,
    },
    Mutant {
        preset: String,
        layout: String,
        mutant: String,
    },
    Upstream(String),
}

impl ModelRef {
    /// The checkpoint layout the reference names (synthetic and mutant models); None for an
    /// upstream directory, whose layout only its files tell.
    pub fn layout(&self) -> Option<ds41_engine::checkpoint::Layout> {
        use ds41_engine::checkpoint::Layout;
        match self {
            ModelRef::Synthetic { layout, .. } | ModelRef::Mutant { layout, .. } => {
                match layout.as_str() {
                    "release" => Some(Layout::Release),
                    "container" => Some(Layout::Container),
                    _ => None,
                }
            }
            ModelRef::Upstream(_) => None,
        }
    }
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelRef::Synthetic {
                preset,
                layout,
                seed,
            } => write!(f, "synthetic:{preset}/{layout}@{seed}"),
            ModelRef::Mutant {
                preset,
                layout,
                mutant,
            } => write!(f, "mutant:{preset}/{layout}/{mutant}"),
            ModelRef::Upstream(rel) => write!(f, "upstream:{rel}"),
        }
    }
}

impl std::str::FromStr for ModelRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let layout_ok = |l: &str| matches!(l, "release" | "container");
        if let Some(rest) = s.strip_prefix("synthetic:") {
            let (body, seed) = match rest.split_once('@') {
                Some((b, seed)) => (
                    b,
                    seed.parse::<u64>()
                        .map_err(|_| format!("`{s}`: seed `{seed}` is not an integer"))?,
                ),
                None => (rest, 0),
            };
            let (preset, layout) = body
                .split_once('/')
                .ok_or(format!("`{s}`: expected synthetic:PRESET/LAYOUT[@SEED]"))?;
            if !layout_ok(layout) || preset.is_empty() {
                return Err(format!(
                    "`{s}`: layout must be `release` or `container` and the preset non-empty"
                ));
            }
            Ok(ModelRef::Synthetic {
                preset: preset.into(),
                layout: layout.into(),
                seed,
            })
        } else if let Some(rest) = s.strip_prefix("mutant:") {
            let parts: Vec<&str> = rest.split('/').collect();
            if parts.len() != 3 || !layout_ok(parts[1]) || parts.iter().any(|p| p.is_empty()) {
                return Err(format!("`{s}`: expected mutant:PRESET/LAYOUT/NAME"));
            }
            Ok(ModelRef::Mutant {
                preset: parts[0].into(),
                layout: parts[1].into(),
                mutant: parts[2].into(),
            })
        } else if let Some(rel) = s.strip_prefix("upstream:") {
            check_rel(s, rel)?;
            Ok(ModelRef::Upstream(rel.into()))
        } else {
            Err(format!("`{s}`: a model is `synthetic:PRESET/LAYOUT[@SEED]`, `mutant:PRESET/LAYOUT/NAME` or `upstream:PATH`"))
        }
    }
}

impl<'de> Deserialize<'de> for ModelRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A data file (crate::locations resolves it): `repo:REL` (the repository's data),
/// `release:REL` (a pinned file of the release snapshot) or `upstream:REL` (the external
/// upstream set, under DS41_UPSTREAM).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum DataRef {
    Upstream(String),
    Repo(String),
    Release(String),
}

fn check_rel(whole: &str, rel: &str) -> Result<(), String> {
    if rel.is_empty() || rel.starts_with('/') || rel.split('/').any(|c| c == "..") {
        return Err(format!(
            "`{whole}`: the path must be relative and stay inside its root"
        ));
    }
    Ok(())
}

/// `root/rel` with every symlink resolved, refused unless it exists and still lies inside
/// `root` (itself resolved): the lexical check of `check_rel` cannot see a link pointing out,
/// and a case must never read, nor quote in a report, a file outside its data roots.
pub fn resolve_inside(root: &Path, rel: &str) -> Result<PathBuf, String> {
    let joined = root.join(rel);
    let root = root
        .canonicalize()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let real = joined.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{} does not exist", joined.display()),
        _ => format!("{}: {e}", joined.display()),
    })?;
    if !real.starts_with(&root) {
        return Err(format!(
            "{} resolves to {}, outside {} (a symbolic link out of the root is refused)",
            joined.display(),
            real.display(),
            root.display()
        ));
    }
    Ok(real)
}

impl std::str::FromStr for DataRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rel) = s.strip_prefix("upstream:") {
            check_rel(s, rel)?;
            Ok(DataRef::Upstream(rel.into()))
        } else if let Some(rel) = s.strip_prefix("repo:") {
            check_rel(s, rel)?;
            Ok(DataRef::Repo(rel.into()))
        } else if let Some(rel) = s.strip_prefix("release:") {
            if crate::locations::release_pin(rel).is_none() {
                let known: Vec<&str> = crate::locations::RELEASE_FILES
                    .iter()
                    .map(|(p, _)| *p)
                    .collect();
                return Err(format!(
                    "`{s}`: not a pinned release file (known: {})",
                    known.join(", ")
                ));
            }
            Ok(DataRef::Release(rel.into()))
        } else {
            Err(format!(
                "`{s}`: a data file is `repo:PATH`, `release:PATH` or `upstream:PATH`"
            ))
        }
    }
}

impl<'de> Deserialize<'de> for DataRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for DataRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataRef::Upstream(r) => write!(f, "upstream:{r}"),
            DataRef::Repo(r) => write!(f, "repo:{r}"),
            DataRef::Release(r) => write!(f, "release:{r}"),
        }
    }
}

/// One runnable case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Case {
    /// `family::file::case`.
    pub name: String,
    pub family: Family,
    pub description: String,
    pub file: PathBuf,
    /// Gate profile this case's golden belongs to.
    pub profile: ProfileName,
    pub tolerance: GateOverrides,
    pub timeout_s: f64,
    /// Long tier: only with DS41_LONG=1 (cargo test) or --long (certify).
    pub long: bool,
    pub spec: Spec,
}

impl Case {
    /// Whether this case reads the external official_a set (`upstream:`): certify leaves it
    /// out of a run without --upstream / DS41_UPSTREAM, the test harness reports it ignored.
    pub fn needs_upstream(&self) -> bool {
        let family = self.spec.family();
        family
            .models()
            .iter()
            .any(|m| matches!(m, ModelRef::Upstream(_)))
            || family
                .data()
                .iter()
                .any(|d| matches!(d, DataRef::Upstream(_)))
    }

    /// Release files this case reads (it is Skipped without a release snapshot).
    pub fn needs_release(&self) -> bool {
        self.spec
            .family()
            .data()
            .iter()
            .any(|d| matches!(d, DataRef::Release(_)))
    }
}

// ------------------------------------------------------------------------- file format

/// The fields every case has, whatever its family.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Common {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    profile: Option<ProfileName>,
    #[serde(default)]
    tolerance: GateOverrides,
    #[serde(default)]
    timeout_s: Option<f64>,
    #[serde(default)]
    long: bool,
}
const COMMON_KEYS: [&str; 6] = [
    "name",
    "description",
    "profile",
    "tolerance",
    "timeout_s",
    "long",
];

const DEFAULT_TIMEOUT_S: f64 = 300.0;
/// A week: longer than any case should take, and far inside what a `Duration` holds.
const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

pub(crate) fn typed<T: serde::de::DeserializeOwned>(
    v: serde_yaml::Value,
    at: &str,
) -> anyhow::Result<T> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            anyhow!("{at}: {}", e.inner())
        } else {
            anyhow!("{at}: field `{path}`: {}", e.inner())
        }
    })
}

/// Load every `*.yaml` under `dir` (sorted), validate, and return the cases sorted by name.
/// Case names must be unique.
pub fn load_cases(dir: &Path) -> anyhow::Result<Vec<Case>> {
    let mut files = Vec::new();
    collect_yaml(dir, &mut files)?;
    files.sort();
    if files.is_empty() {
        bail!("{}: no case files (*.yaml)", dir.display());
    }
    let mut cases = Vec::new();
    for f in &files {
        cases.extend(load_case_file(f)?);
    }
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    for w in cases.windows(2) {
        if w[0].name == w[1].name {
            bail!(
                "case `{}` is defined twice ({} and {})",
                w[0].name,
                w[0].file.display(),
                w[1].file.display()
            );
        }
    }
    Ok(cases)
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
    for entry in rd {
        let p = entry.map_err(|e| anyhow!("{}: {e}", dir.display()))?.path();
        if p.is_dir() {
            collect_yaml(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
    Ok(())
}

/// Parse and validate one case file: `family`, optional `description`, and `cases`, each a
/// mapping of the common fields plus the family's own fields (unknown keys refused).
pub fn load_case_file(path: &Path) -> anyhow::Result<Vec<Case>> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{file}: {e}"))?;
    let root: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| anyhow!("{file}: not YAML: {e}"))?;
    let serde_yaml::Value::Mapping(mut root) = root else {
        bail!("{file}: the top level must be a mapping")
    };
    for k in root.keys() {
        let k = k.as_str().unwrap_or("?");
        if !matches!(k, "family" | "description" | "cases") {
            bail!("{file}: field `{k}`: unknown (expected family, description, cases)");
        }
    }
    let family: Family = typed(
        root.remove("family")
            .ok_or_else(|| anyhow!("{file}: field `family`: missing"))?,
        &format!("{file}: field `family`"),
    )?;
    let Some(serde_yaml::Value::Sequence(raw_cases)) = root.remove("cases") else {
        bail!("{file}: field `cases`: missing or not a list")
    };
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("cases")
        .to_string();
    let mut out = Vec::new();
    for (i, raw) in raw_cases.into_iter().enumerate() {
        let serde_yaml::Value::Mapping(mut m) = raw else {
            bail!("{file}: cases[{i}]: not a mapping")
        };
        let mut common = serde_yaml::Mapping::new();
        for k in COMMON_KEYS {
            if let Some(v) = m.remove(k) {
                common.insert(k.into(), v);
            }
        }
        let c: Common = typed(
            serde_yaml::Value::Mapping(common),
            &format!("{file}: cases[{i}]"),
        )?;
        let at = format!("{file}: cases[{i}] (`{}`)", c.name);
        let rest = serde_yaml::Value::Mapping(m);
        let spec = family.parse_spec(rest, &at)?;
        if c.name.is_empty()
            || !c
                .name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
        {
            bail!("{at}: field `name` must be non-empty [A-Za-z0-9-_.]");
        }
        let timeout_s = c.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
        if !(timeout_s > 0.0 && timeout_s <= MAX_TIMEOUT_S) {
            bail!(
                "{at}: field `timeout_s` must be a number of seconds in (0, {MAX_TIMEOUT_S}], got {timeout_s:?}"
            );
        }
        c.tolerance.validate().map_err(|e| anyhow!("{at}: {e}"))?;
        spec.family().validate().map_err(|e| anyhow!("{at}: {e}"))?;
        let profile = c.profile.unwrap_or(spec.family().default_profile());
        out.push(Case {
            name: format!("{}::{stem}::{}", family.as_str(), c.name),
            family,
            description: c.description,
            file: path.to_path_buf(),
            profile,
            tolerance: c.tolerance,
            timeout_s,
            long: c.long,
            spec,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn residual_case_parses_with_all_golden_kinds() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "r.yaml",
            "family: residual\ncases:\n  - name: a\n    model: synthetic:tiny/release@3\n    golden: reference\n    tokens: [1, 2, 3]\n    numerics: exact\n    index_k: owner\n  - name: b\n    model: upstream:official_a/checkpoint\n    golden: {file: upstream:official_a/p01_d47/golden_ref_defect.safetensors}\n    prefill: 1\n    numerics: upstream\n    index_k: as-shipped\n    require: [logits, residual]\n  - name: c\n    model: upstream:waste_ds41_synth/container\n    golden: {waste_oracle: {dir: upstream:waste_ds41_synth/oracle, variant: as_shipped}}\n    tokens: [3, 7]\n    numerics: exact\n    index_k: as-shipped\n    prefix_lengths: [1, 2]\n    timeout_s: 10\n",
        );
        let cases = load_case_file(&p).unwrap();
        assert_eq!(cases.len(), 3);
        assert_eq!(cases[0].name, "residual::r::a");
        assert!(
            !cases[0].needs_upstream() && cases[1].needs_upstream() && cases[2].needs_upstream()
        );
        assert_eq!(cases[1].profile, ProfileName::Upstream);
        match &cases[2].spec {
            Spec::Residual(s) => assert!(
                matches!(&s.golden, GoldenSpec::WasteOracle { variant, .. } if variant == "as_shipped")
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_field_names_file_case_and_field() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "bad.yaml",
            "family: state\ncases:\n  - name: ok\n    model: synthetic:tiny/release\n    relation: snapshot_restore\n    tokens: [1, 2, 3]\n    splits: [1]\n    numerics: exact\n    index_k: owner\n    tokenz: [1]\n",
        );
        let e = load_case_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("bad.yaml") && e.contains("tokenz") && e.contains("cases[0]"),
            "{e}"
        );
    }

    #[test]
    fn semantic_errors_name_the_case_and_field() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "s.yaml",
            "family: state\ncases:\n  - name: split-out-of-range\n    model: synthetic:tiny/release\n    relation: snapshot_restore\n    tokens: [1, 2, 3]\n    splits: [3]\n    numerics: exact\n    index_k: owner\n",
        );
        let e = load_case_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("split-out-of-range") && e.contains("splits"),
            "{e}"
        );
        let p = write(d.path(), "m.yaml", "family: loader\ncases:\n  - name: x\n    model: synthetic:tiny/floppy\n    expect: accept\n");
        let e = load_case_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("m.yaml") && e.contains("model") && e.contains("layout"),
            "{e}"
        );
        let p = write(
            d.path(),
            "u.yaml",
            "family: loader\ncases:\n  - name: x\n    model: upstream:../etc\n    expect: accept\n",
        );
        assert!(load_case_file(&p).is_err());
    }

    #[test]
    fn timeouts_and_tolerances_are_validated_like_the_gates() {
        let d = tempfile::tempdir().unwrap();
        let case = |extra: &str| {
            format!("family: loader\ncases:\n  - name: x\n    model: synthetic:tiny/release\n    expect: accept\n{extra}")
        };
        for (extra, words) in [
            ("    timeout_s: 1e300\n", "timeout_s"),
            ("    timeout_s: .inf\n", "timeout_s"),
            ("    timeout_s: .nan\n", "timeout_s"),
            ("    timeout_s: 0\n", "timeout_s"),
            (
                "    tolerance: {residual_rel_l2: .nan}\n",
                "tolerance.residual_rel_l2",
            ),
            (
                "    tolerance: {logits_rel_l2: .inf}\n",
                "tolerance.logits_rel_l2",
            ),
            (
                "    tolerance: {logits_max_abs: -0.5}\n",
                "tolerance.logits_max_abs",
            ),
        ] {
            let p = write(d.path(), "t.yaml", &case(extra));
            let e = load_case_file(&p).unwrap_err().to_string();
            assert!(e.contains("t.yaml") && e.contains(words), "{extra}: {e}");
        }
        let p = write(
            d.path(),
            "ok.yaml",
            &case("    timeout_s: 604800\n    tolerance: {residual_rel_l2: 0.5}\n"),
        );
        assert_eq!(load_case_file(&p).unwrap()[0].timeout_s, 604800.0);
    }

    #[test]
    fn paths_resolve_inside_their_root_or_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.json"), "{}").unwrap();
        std::fs::write(d.path().join("outside.txt"), "secret").unwrap();
        std::os::unix::fs::symlink("sub/a.json", root.join("inner-link")).unwrap();
        std::os::unix::fs::symlink("../outside.txt", root.join("outer-link")).unwrap();
        std::os::unix::fs::symlink("..", root.join("sub/up")).unwrap();
        let real = |p: &str| root.join(p).canonicalize().unwrap();
        assert_eq!(
            resolve_inside(&root, "sub/a.json").unwrap(),
            real("sub/a.json")
        );
        assert_eq!(
            resolve_inside(&root, "inner-link").unwrap(),
            real("sub/a.json")
        );
        assert_eq!(resolve_inside(&root, "sub/up/sub").unwrap(), real("sub"));
        let e = resolve_inside(&root, "outer-link").unwrap_err();
        assert!(e.contains("outside") && !e.contains("secret"), "{e}");
        assert!(resolve_inside(&root, "sub/up/../outside.txt").is_err());
        let e = resolve_inside(&root, "missing.json").unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn vision_cases_parse_and_errors_name_the_field() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "v.yaml",
            "family: vision\ncases:\n  - name: pre\n    part: preprocess\n    golden: repo:g/expected.json\n    config: release\n  - name: span\n    part: span\n    weightless: {config: release:config.json, tokenizer: release:tokenizer.json}\n    golden: repo:g/span.json\n    span: two\n",
        );
        let cases = load_case_file(&p).unwrap();
        assert_eq!(cases[0].name, "vision::v::pre");
        assert!(!cases[0].needs_release() && cases[1].needs_release());
        let tower = "part: tower\n    golden: repo:t.safetensors\n    model: synthetic:tiny-sharded/release\n    image: repo:i.png";
        for (yaml, needle) in [
            ("part: preprocess\n    golden: repo:g.json\n    numerics: exact", "`numerics` is not a field of part Preprocess"),
            ("part: span\n    golden: repo:g.json\n    span: x", "needs `weightless`"),
            (&format!("{tower}\n    numerics: exact\n    span: x"), "`span` is not a field of part Tower"),
            (tower, "needs `numerics`"),
            (&format!("{tower}\n    numerics: exact\n    golden_image: 0\n    tower_weights: repo:w.safetensors"), "golden_image"),
            ("part: pixels\n    golden: repo:g.json", "part"),
        ] {
            let p = write(
                d.path(),
                "bad.yaml",
                &format!("family: vision\ncases:\n  - name: x\n    {yaml}\n"),
            );
            let e = load_case_file(&p).unwrap_err().to_string();
            assert!(e.contains("bad.yaml") && e.contains(needle), "{yaml}: {e}");
        }
    }

    #[test]
    fn engram_cases_parse_and_errors_name_the_field() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "e.yaml",
            "family: engram\ncases:\n  - name: rel\n    model: synthetic:tiny/release\n    relation: dead_latches\n    tokens: [1, 2, 3]\n    dead: [1]\n    pad_token: 67\n  - name: gold\n    weightless: {config: upstream:config/config.json, tokenizer: upstream:tokenizer/tokenizer.json}\n    golden: {file: upstream:engram/engram_hash_golden_real.json, ids: hash_with_dead_5_7, dead: dead_positions}\n",
        );
        let cases = load_case_file(&p).unwrap();
        assert_eq!(cases[0].name, "engram::e::rel");
        assert!(!cases[0].needs_upstream() && cases[1].needs_upstream());
        for (yaml, needle) in [
            (
                "relation: dead_latches\n    tokens: [1, 2]\n    dead: [2]\n    pad_token: 1",
                "dead",
            ),
            (
                "relation: dead_latches\n    tokens: [1, 2]\n    dead: [1]",
                "pad_token",
            ),
            (
                "relation: dead_latches\n    tokens: [1, 2]\n    pad_token: 1",
                "dead",
            ),
            (
                "golden: {file: repo:x.json, ids: k}\n    tokens: [1]",
                "golden",
            ),
            ("golden: {file: repo:x.safetensors, dead: d}", "golden.dead"),
            (
                "relation: dead_latches\n    golden: {file: repo:x.json, ids: k}",
                "exactly one of `golden`",
            ),
            (
                "relation: dead_latched\n    tokens: [1]\n    dead: [0]\n    pad_token: 1",
                "relation",
            ),
        ] {
            let p = write(
                d.path(),
                "bad.yaml",
                &format!("family: engram\ncases:\n  - name: x\n    model: synthetic:tiny/release\n    {yaml}\n"),
            );
            let e = load_case_file(&p).unwrap_err().to_string();
            assert!(e.contains("bad.yaml") && e.contains(needle), "{yaml}: {e}");
        }
    }

    #[test]
    fn repository_cases_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cases");
        let cases = load_cases(&dir).unwrap();
        assert!(!cases.is_empty());
    }
}
