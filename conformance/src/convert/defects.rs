//! Converter defects: a conversion with exactly one known mistake, the negative controls of the
//! converter gate (`ds41 gate converter`). Each names the tensor or field the gate must name
//! when it refuses the result, so "every defect is refused, by name" is checked from this list
//! alone.

/// One deliberate conversion mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConverterDefect {
    /// `layers.0.attn.wq_b.weight` is not written.
    DroppedTensor,
    /// Expert 1 of layer 0: `w2` is encoded from its transpose laid out in the stored shape.
    TransposedExpert,
    /// Layer 0's first gate codebook (stage 0) is written at twice its fitted values.
    MisScaledCodebook,
    /// The first Engram table's rows are rotated by one.
    ShuffledEngram,
    /// Rows 0 and 1 of the last Engram table trade places (the table's rel L2 stays within
    /// its limit: only the per-row and per-value checks see it).
    SwappedEngramRows,
    /// Expert 2 of layer 0: a payload byte changes after its CRC-32 was taken.
    StaleCrc,
    /// Experts 0 and 1 of the last layer trade records.
    SwappedExperts,
    /// `layers.1.attn.wo_b.weight`'s group scales are written doubled.
    MisScaledTrunk,
    /// `layers.0.attn.wq_a.weight` is written transposed, with the transposed shape.
    TransposedTrunk,
    /// `layers.0.attn.wkv.weight` (Q8G) is declared Q4G: its int8 codes are read as nibbles.
    WrongDtype,
    /// The last token trades Engram compressed ids with the nearest token that has another.
    ShiftedTokenMap,
}

/// A defect, its description and what the gate's refusal must mention.
#[derive(Debug, Clone, Copy)]
pub struct DefectInfo {
    pub defect: ConverterDefect,
    pub name: &'static str,
    pub description: &'static str,
    /// Every one of these must appear in one of the gate's failure lines.
    pub named: &'static [&'static str],
}

pub const DEFECTS: &[DefectInfo] = &[
    DefectInfo {
        defect: ConverterDefect::DroppedTensor,
        name: "dropped-tensor",
        description: "`layers.0.attn.wq_b.weight` is not written",
        named: &["layers.0.attn.wq_b.weight"],
    },
    DefectInfo {
        defect: ConverterDefect::TransposedExpert,
        name: "transposed-expert",
        description: "expert 1 of layer 0 has its `w2` encoded from the transpose, laid out in the stored shape",
        named: &["layers.0.ffn.experts.1.w2.weight"],
    },
    DefectInfo {
        defect: ConverterDefect::MisScaledCodebook,
        name: "mis-scaled-codebook",
        description: "layer 0's stage-0 gate codebook is written at twice its fitted values",
        named: &["layers.0.ffn.experts.0.w1.weight"],
    },
    DefectInfo {
        defect: ConverterDefect::ShuffledEngram,
        name: "shuffled-engram",
        description: "the first Engram table's rows are rotated by one",
        named: &["engram.embed.weight"],
    },
    DefectInfo {
        defect: ConverterDefect::SwappedEngramRows,
        name: "swapped-engram-rows",
        description: "rows 0 and 1 of the last Engram table trade places",
        named: &["engram.embed.weight", "row"],
    },
    DefectInfo {
        defect: ConverterDefect::StaleCrc,
        name: "stale-crc",
        description: "one payload byte of expert 2 in experts-L0.bin changes after its CRC-32 was taken",
        named: &["layers.0.ffn.experts.2.", "checksum mismatch"],
    },
    DefectInfo {
        defect: ConverterDefect::SwappedExperts,
        name: "swapped-experts",
        description: "experts 0 and 1 of the last layer trade records",
        named: &["ffn.experts.0.", "ffn.experts.1."],
    },
    DefectInfo {
        defect: ConverterDefect::MisScaledTrunk,
        name: "mis-scaled-trunk",
        description: "`layers.1.attn.wo_b.weight` is written with doubled group scales",
        named: &["layers.1.attn.wo_b.weight"],
    },
    DefectInfo {
        defect: ConverterDefect::TransposedTrunk,
        name: "transposed-trunk",
        description: "`layers.0.attn.wq_a.weight` is written transposed, with the transposed shape",
        named: &["layers.0.attn.wq_a.weight"],
    },
    DefectInfo {
        defect: ConverterDefect::WrongDtype,
        name: "wrong-dtype",
        description: "`layers.0.attn.wkv.weight` is written as Q8G codes but declared Q4G (fmt 3), with the Q4G byte count",
        named: &["layers.0.attn.wkv.weight"],
    },
    DefectInfo {
        defect: ConverterDefect::ShiftedTokenMap,
        name: "shifted-token-map",
        description: "in engram-tokmap.bin the last token trades compressed ids with the nearest token that has another",
        named: &["engram-tokmap.bin"],
    },
];

impl ConverterDefect {
    pub fn info(self) -> &'static DefectInfo {
        DEFECTS
            .iter()
            .find(|d| d.defect == self)
            .expect("every defect is listed")
    }
}

impl std::str::FromStr for ConverterDefect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DEFECTS
            .iter()
            .find(|d| d.name == s)
            .map(|d| d.defect)
            .ok_or_else(|| {
                format!(
                    "unknown converter defect `{s}` (known: {})",
                    DEFECTS
                        .iter()
                        .map(|d| d.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}
