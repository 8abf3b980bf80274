//! Tolerance profiles (CONTRACT.md §4): the thresholds every numeric check is judged by, read
//! from `gates/<profile>.yaml`. Discrete decisions are exact in every profile; the only freedom
//! is the fragile-flip excuse of ../shared/tools/README.md, which a profile may enable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The three profiles, ordered from strictest to loosest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileName {
    /// f32 arithmetic on exactly dequantised weights.
    Exact,
    /// bf16 activations and the official fake-quant steps.
    Upstream,
    /// Engines running requantised weights.
    Quantized,
}

impl ProfileName {
    pub const ALL: [ProfileName; 3] = [
        ProfileName::Exact,
        ProfileName::Upstream,
        ProfileName::Quantized,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileName::Exact => "exact",
            ProfileName::Upstream => "upstream",
            ProfileName::Quantized => "quantized",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl std::fmt::Display for ProfileName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a logits row's top-1 decision is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgmaxRule {
    /// The engine's argmax equals the golden's.
    Exact,
    /// The golden's argmax is among the engine's five largest logits (vLLM-style containment).
    Top5,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogitGates {
    pub rel_l2: f64,
    pub max_abs: f64,
    pub argmax: ArgmaxRule,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResidualGates {
    /// Per (token, layer) cell, over [hc, dim].
    pub rel_l2: f64,
}

/// The fragile-flip rule of compare.py: a mismatched decision is excused when its golden
/// margin is at most `min(cap, floor + factor * upstream drift)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionGates {
    /// false: every mismatch fails and everything is compared (compare.py `--strict`).
    pub excuse_fragile_flips: bool,
    pub fragile_floor: f64,
    pub fragile_factor: f64,
    pub fragile_cap_topk: f64,
    pub fragile_cap_experts: f64,
    /// Fail when more flips than this are excused (None: no limit, but always reported).
    #[serde(default)]
    pub max_fragile: Option<usize>,
    /// Compare exact ties (golden margin 0) strictly too. By default a flip at an exact tie is
    /// excused in every profile (counted, and what it feeds skipped): two correct engines may
    /// break ties differently. Set for an engine that claims the canonical tie rule
    /// (`ds41 certify --canonical-ties`, or a residual case's `canonical_ties: true`).
    #[serde(default)]
    pub strict_ties: bool,
}

/// Teacher-forced replay thresholds (compare.py `--replay`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayGates {
    pub attn_rel_l2: f64,
    pub moe_rel_l2: f64,
    pub residual_rel_l2: f64,
    pub engram_rel_l2: f64,
    pub fragile_floor: f64,
    pub logits_rel_l2: f64,
    pub logits_max_abs: f64,
}

/// Session-state relations: a continued run against the uninterrupted one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateGates {
    /// 0 = bit-identical.
    pub logits_max_abs: f64,
}

/// The vision tower and aligner (the `vision` family's `tower` part), per stage (`vision.embed`,
/// each block, `vision.norm`, `vision.aligner`), rel L2 over the stage's whole output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionGates {
    /// End to end: every stage from the engine's own previous stage.
    pub tower_rel_l2: f64,
    /// Teacher-forced: every stage from the golden's previous stage.
    pub tower_replay_rel_l2: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gates {
    pub profile: ProfileName,
    pub description: String,
    pub logits: LogitGates,
    pub residual: ResidualGates,
    pub decisions: DecisionGates,
    pub replay: ReplayGates,
    pub state: StateGates,
    pub vision: VisionGates,
}

/// Per-case overrides (ONNX-style `data.json` tolerances): any field given replaces the profile
/// value for that case and is reported with the result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateOverrides {
    pub logits_rel_l2: Option<f64>,
    pub logits_max_abs: Option<f64>,
    pub residual_rel_l2: Option<f64>,
    /// For a golden set whose calibration shows correct engines (noise stand-ins) changing the
    /// top-1 of a near-tied logits row.
    pub argmax: Option<ArgmaxRule>,
    /// Teacher-forced limit of the stream entering a block (`block_input`): for a golden with
    /// image spans, whose layer-0 image rows are the engine's own vision tower's output and
    /// drift with it.
    pub replay_engram_rel_l2: Option<f64>,
}

/// Every threshold, in a profile or a case's override, is a finite number >= 0: NaN would
/// make its comparison always false and silently drop the check, infinity would pass anything.
pub fn check_threshold(field: &str, v: f64) -> Result<(), String> {
    if !v.is_finite() || v < 0.0 {
        return Err(format!("field `{field}` must be finite and >= 0, got {v}"));
    }
    Ok(())
}

impl GateOverrides {
    /// The same rule as the profiles' thresholds ([`check_threshold`]).
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("tolerance.logits_rel_l2", self.logits_rel_l2),
            ("tolerance.logits_max_abs", self.logits_max_abs),
            ("tolerance.residual_rel_l2", self.residual_rel_l2),
            ("tolerance.replay_engram_rel_l2", self.replay_engram_rel_l2),
        ];
        for (name, v) in fields {
            if let Some(v) = v {
                check_threshold(name, v)?;
            }
        }
        Ok(())
    }
}

impl Gates {
    pub fn with_overrides(&self, o: &GateOverrides) -> Gates {
        let mut g = self.clone();
        if let Some(v) = o.logits_rel_l2 {
            g.logits.rel_l2 = v;
        }
        if let Some(v) = o.logits_max_abs {
            g.logits.max_abs = v;
        }
        if let Some(v) = o.residual_rel_l2 {
            g.residual.rel_l2 = v;
        }
        if let Some(v) = o.argmax {
            g.logits.argmax = v;
        }
        if let Some(v) = o.replay_engram_rel_l2 {
            g.replay.engram_rel_l2 = v;
        }
        g
    }
}

/// All three profiles, loaded and validated.
#[derive(Debug, Clone)]
pub struct GateSet {
    pub dir: PathBuf,
    pub profiles: BTreeMap<ProfileName, Gates>,
}

impl GateSet {
    /// Read `exact.yaml`, `upstream.yaml` and `quantized.yaml` from `dir`; each must exist, parse
    /// strictly, name its own profile and have finite non-negative thresholds.
    pub fn load(dir: &Path) -> anyhow::Result<GateSet> {
        let mut profiles = BTreeMap::new();
        for p in ProfileName::ALL {
            let file = dir.join(format!("{}.yaml", p.as_str()));
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let de = serde_yaml::Deserializer::from_str(&text);
            let gates: Gates = serde_path_to_error::deserialize(de).map_err(|e| {
                anyhow::anyhow!("{}: field `{}`: {}", file.display(), e.path(), e.inner())
            })?;
            if gates.profile != p {
                anyhow::bail!(
                    "{}: field `profile` is `{}`, expected `{}`",
                    file.display(),
                    gates.profile,
                    p
                );
            }
            gates
                .validate()
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            profiles.insert(p, gates);
        }
        Ok(GateSet {
            dir: dir.to_path_buf(),
            profiles,
        })
    }

    pub fn get(&self, p: ProfileName) -> &Gates {
        &self.profiles[&p]
    }
}

impl Gates {
    fn validate(&self) -> Result<(), String> {
        let fields = [
            ("logits.rel_l2", self.logits.rel_l2),
            ("logits.max_abs", self.logits.max_abs),
            ("residual.rel_l2", self.residual.rel_l2),
            ("decisions.fragile_floor", self.decisions.fragile_floor),
            ("decisions.fragile_factor", self.decisions.fragile_factor),
            (
                "decisions.fragile_cap_topk",
                self.decisions.fragile_cap_topk,
            ),
            (
                "decisions.fragile_cap_experts",
                self.decisions.fragile_cap_experts,
            ),
            ("replay.attn_rel_l2", self.replay.attn_rel_l2),
            ("replay.moe_rel_l2", self.replay.moe_rel_l2),
            ("replay.residual_rel_l2", self.replay.residual_rel_l2),
            ("replay.engram_rel_l2", self.replay.engram_rel_l2),
            ("replay.fragile_floor", self.replay.fragile_floor),
            ("replay.logits_rel_l2", self.replay.logits_rel_l2),
            ("replay.logits_max_abs", self.replay.logits_max_abs),
            ("state.logits_max_abs", self.state.logits_max_abs),
            ("vision.tower_rel_l2", self.vision.tower_rel_l2),
            (
                "vision.tower_replay_rel_l2",
                self.vision.tower_replay_rel_l2,
            ),
        ];
        for (name, v) in fields {
            check_threshold(name, v)?;
        }
        if self.profile == ProfileName::Exact && self.decisions.excuse_fragile_flips {
            return Err(
                "field `decisions.excuse_fragile_flips`: the exact profile has no \
                        rounding noise to excuse flips with; it must be false"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_gates() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../gates")
    }

    #[test]
    fn repository_profiles_load_and_are_ordered() {
        let set = GateSet::load(&repo_gates()).unwrap();
        let (e, u, q) = (
            set.get(ProfileName::Exact),
            set.get(ProfileName::Upstream),
            set.get(ProfileName::Quantized),
        );
        assert!(e.logits.rel_l2 < u.logits.rel_l2 && u.logits.rel_l2 < q.logits.rel_l2);
        assert!(e.residual.rel_l2 < u.residual.rel_l2 && u.residual.rel_l2 < q.residual.rel_l2);
        assert!(!e.decisions.excuse_fragile_flips && u.decisions.excuse_fragile_flips);
    }

    #[test]
    fn unknown_field_is_named_with_its_file() {
        let dir = tempfile::tempdir().unwrap();
        for p in ProfileName::ALL {
            std::fs::copy(
                repo_gates().join(format!("{p}.yaml")),
                dir.path().join(format!("{p}.yaml")),
            )
            .unwrap();
        }
        let f = dir.path().join("upstream.yaml");
        let text = std::fs::read_to_string(&f)
            .unwrap()
            .replace("  rel_l2: 0.06", "  rel_l3: 0.06");
        std::fs::write(&f, text).unwrap();
        let err = GateSet::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("upstream.yaml") && err.contains("rel_l3"),
            "{err}"
        );
    }

    #[test]
    fn exact_profile_may_not_excuse_flips() {
        let dir = tempfile::tempdir().unwrap();
        for p in ProfileName::ALL {
            let mut t = std::fs::read_to_string(repo_gates().join(format!("{p}.yaml"))).unwrap();
            if p == ProfileName::Exact {
                t = t.replace("excuse_fragile_flips: false", "excuse_fragile_flips: true");
            }
            std::fs::write(dir.path().join(format!("{p}.yaml")), t).unwrap();
        }
        let err = GateSet::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("excuse_fragile_flips"), "{err}");
    }

    /// gates/upstream.yaml must carry official_a's own recommendations (end to end and
    /// replay), so the cases judged by them use the thresholds the set was calibrated for.
    #[test]
    #[cfg_attr(
        not(ds41_upstream),
        ignore = "DS41_UPSTREAM not set (the official_a set)"
    )]
    fn upstream_profile_matches_official_a_recommendations() {
        let up = ds41_engine::testing::upstream();
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(Path::new(&up).join("official_a/meta.json")).unwrap(),
        )
        .unwrap();
        let args = |key: &str| -> BTreeMap<String, f64> {
            let list: Vec<&str> = meta[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            list.windows(2)
                .filter(|w| w[0].starts_with("--") && !w[1].starts_with("--"))
                .map(|w| {
                    (
                        w[0].trim_start_matches("--").to_string(),
                        w[1].parse().unwrap(),
                    )
                })
                .collect()
        };
        let g = GateSet::load(&repo_gates()).unwrap();
        let u = g.get(ProfileName::Upstream);
        let c = args("recommended_compare_args");
        assert_eq!(c["residual-rel-l2"], u.residual.rel_l2);
        assert_eq!(c["logits-max-abs"], u.logits.max_abs);
        assert_eq!(c["logits-rel-l2"], u.logits.rel_l2);
        let r = args("recommended_replay_args");
        assert_eq!(r.len(), 7, "{r:?}");
        assert_eq!(r["attn-rel-l2"], u.replay.attn_rel_l2);
        assert_eq!(r["moe-rel-l2"], u.replay.moe_rel_l2);
        assert_eq!(r["residual-rel-l2"], u.replay.residual_rel_l2);
        assert_eq!(r["engram-rel-l2"], u.replay.engram_rel_l2);
        assert_eq!(r["fragile-floor"], u.replay.fragile_floor);
        assert_eq!(r["logits-max-abs"], u.replay.logits_max_abs);
        assert_eq!(r["logits-rel-l2"], u.replay.logits_rel_l2);
    }
}
