//! The converter gate's thresholds, `gates/converter.yaml` (documented there and in
//! gates/README.md), read strictly: unknown fields, a wrong `gate` name and non-finite or
//! negative limits are refused with the field named.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::gates::{check_threshold, Gates, ProfileName};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrunkLimits {
    pub f32_rel_l2: f64,
    pub q8g_rel_l2: f64,
    pub q4g_rel_l2: f64,
    pub q3g_rel_l2: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertLimits {
    pub vq3r_rel_l2: f64,
    pub outlier_factor: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngramLimits {
    pub rel_l2_4bit: f64,
    pub rel_l2_8bit: f64,
    pub max_steps: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardSettings {
    /// Tolerance profile the two layouts' forwards are compared in.
    pub profile: ProfileName,
    pub tokens: usize,
    pub prefill: usize,
    /// Whether the end-to-end comparison decides the verdict (false: it is reported only,
    /// and the teacher-forced replay, which compares every cell, decides).
    pub judge_end_to_end: bool,
    /// Whether the replay decides the verdict when trunk linears are stored at 4 or 3 bits
    /// (Q4G, Q3G); the replay limits below are calibrated for an F32 / Q8G trunk.
    pub judge_replay_low_bit_trunk: bool,
    /// The profile's teacher-forced per-cell limits, replaced for a container's own
    /// quantisation (3-bit VQ experts, 4-bit Engram rows).
    pub replay: ReplayLimits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayLimits {
    pub attn_rel_l2: f64,
    pub moe_rel_l2: f64,
    pub residual_rel_l2: f64,
    pub engram_rel_l2: f64,
}

impl ForwardSettings {
    /// `profile` with the replay limits replaced.
    pub fn apply(&self, profile: &Gates) -> Gates {
        let mut g = profile.clone();
        g.replay.attn_rel_l2 = self.replay.attn_rel_l2;
        g.replay.moe_rel_l2 = self.replay.moe_rel_l2;
        g.replay.residual_rel_l2 = self.replay.residual_rel_l2;
        g.replay.engram_rel_l2 = self.replay.engram_rel_l2;
        g
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConverterGates {
    pub gate: String,
    pub description: String,
    pub trunk: TrunkLimits,
    pub experts: ExpertLimits,
    pub engram: EngramLimits,
    pub row_factor: f64,
    pub forward: ForwardSettings,
}

/// File name of the gate in a gates directory.
pub const FILE: &str = "converter.yaml";

impl ConverterGates {
    pub fn parse(text: &str, file: &Path) -> anyhow::Result<ConverterGates> {
        let de = serde_yaml::Deserializer::from_str(text);
        let g: ConverterGates = serde_path_to_error::deserialize(de).map_err(|e| {
            anyhow::anyhow!("{}: field `{}`: {}", file.display(), e.path(), e.inner())
        })?;
        if g.gate != "converter" {
            anyhow::bail!(
                "{}: field `gate` is `{}`, expected `converter`",
                file.display(),
                g.gate
            );
        }
        let fields = [
            ("trunk.f32_rel_l2", g.trunk.f32_rel_l2),
            ("trunk.q8g_rel_l2", g.trunk.q8g_rel_l2),
            ("trunk.q4g_rel_l2", g.trunk.q4g_rel_l2),
            ("trunk.q3g_rel_l2", g.trunk.q3g_rel_l2),
            ("experts.vq3r_rel_l2", g.experts.vq3r_rel_l2),
            ("experts.outlier_factor", g.experts.outlier_factor),
            ("engram.rel_l2_4bit", g.engram.rel_l2_4bit),
            ("engram.rel_l2_8bit", g.engram.rel_l2_8bit),
            ("engram.max_steps", g.engram.max_steps),
            ("row_factor", g.row_factor),
            ("forward.replay.attn_rel_l2", g.forward.replay.attn_rel_l2),
            ("forward.replay.moe_rel_l2", g.forward.replay.moe_rel_l2),
            (
                "forward.replay.residual_rel_l2",
                g.forward.replay.residual_rel_l2,
            ),
            (
                "forward.replay.engram_rel_l2",
                g.forward.replay.engram_rel_l2,
            ),
        ];
        for (name, v) in fields {
            check_threshold(name, v).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        }
        if g.forward.tokens == 0 || g.forward.prefill == 0 || g.forward.prefill > g.forward.tokens {
            anyhow::bail!(
                "{}: field `forward`: prefill {} must be between 1 and tokens {}",
                file.display(),
                g.forward.prefill,
                g.forward.tokens
            );
        }
        Ok(g)
    }

    /// Read `dir/converter.yaml`.
    pub fn load(dir: &Path) -> anyhow::Result<ConverterGates> {
        let file = dir.join(FILE);
        let text = std::fs::read_to_string(&file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        Self::parse(&text, &file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_parses_and_bad_fields_are_named() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gates");
        let g = ConverterGates::load(&dir).unwrap();
        assert_eq!(g.forward.profile, ProfileName::Quantized);
        let text = std::fs::read_to_string(dir.join(FILE)).unwrap();
        let bad = text.replace("q4g_rel_l2: 0.20", "q4g_rel_l2: -1");
        let e = ConverterGates::parse(&bad, Path::new("x.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("trunk.q4g_rel_l2"), "{e}");
        let bad = text.replace("row_factor:", "row_factr:");
        let e = ConverterGates::parse(&bad, Path::new("x.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("row_factr"), "{e}");
    }
}
