//! The bytes of weights one decode token reads, from the checkpoint itself: the floor a
//! memory-bound decode cannot beat is these bytes over the machine's read bandwidth.
//!
//! Per token a forward reads the whole trunk (attention, shared experts, router, norms,
//! hyper-connection weights of every layer), the head and final norm, one embedding row, the
//! Engram table rows its hash ids select, and the routed experts it was routed to (counted
//! from the run's own expert trace). MTP tensors are not read by a main-model forward.

use std::collections::BTreeMap;

use ds41_engine::checkpoint::Checkpoint;

/// Bytes per decode token, by part.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Footprint {
    pub trunk: u64,
    pub head: u64,
    pub embedding_row: u64,
    pub engram_rows: u64,
    /// Mean over the measured tokens of the routed experts' bytes.
    pub routed_experts: u64,
    /// Tensors whose stored size the reader cannot state (none for either layout).
    pub unknown_tensors: usize,
    /// Weight elements multiplied per token (trunk, head and routed experts: one
    /// multiply-add each; attention over the cache comes on top and grows with position).
    pub multiply_adds: u64,
}

impl Footprint {
    pub fn total(&self) -> u64 {
        self.trunk + self.head + self.embedding_row + self.engram_rows + self.routed_experts
    }
}

enum Part {
    Trunk,
    Head,
    Embedding,
    Engram,
    Expert { layer: usize, expert: usize },
    NotRead,
}

/// Which part of a decode step reads tensor `name` (release names; a `.scale` companion goes
/// with its weight).
fn part(name: &str) -> Part {
    let base = name.strip_suffix(".scale").unwrap_or(name);
    if base.starts_with("mtp.") {
        return Part::NotRead;
    }
    if base.starts_with("embed.") {
        return Part::Embedding;
    }
    if base.starts_with("head.") || base == "norm.weight" || base.starts_with("hc_head") {
        return Part::Head;
    }
    let mut it = base.split('.');
    if let (Some("layers"), Some(l)) = (it.next(), it.next().and_then(|l| l.parse().ok())) {
        let rest: Vec<&str> = it.collect();
        if rest.starts_with(&["engram", "embed"]) {
            return Part::Engram;
        }
        if rest.starts_with(&["ffn", "experts"]) {
            if let Some(e) = rest.get(2).and_then(|e| e.parse().ok()) {
                return Part::Expert {
                    layer: l,
                    expert: e,
                };
            }
        }
    }
    Part::Trunk
}

/// The stored bytes of a checkpoint by the part of a decode step that reads them.
#[derive(Debug, Clone, Default)]
pub struct WeightBytes {
    /// Read whole by every token (attention, shared experts, router, norms, mixing).
    pub trunk: u64,
    pub head: u64,
    pub embedding_row: u64,
    /// The Engram rows one token selects (every Engram layer).
    pub engram_rows: u64,
    /// (bytes, elements) of routed expert `(layer, expert)`.
    pub experts: BTreeMap<(usize, usize), (u64, u64)>,
    /// Elements of the trunk and head (one multiply-add each per token).
    pub dense_elements: u64,
    /// Tensors whose stored size the reader cannot state (none for either layout).
    pub unknown_tensors: usize,
}

impl WeightBytes {
    pub fn of(ckpt: &dyn Checkpoint) -> anyhow::Result<WeightBytes> {
        let cfg = ckpt.config();
        let mut w = WeightBytes::default();
        let engram_cols = cfg.engram_max_ngram_size.saturating_sub(1) * cfg.engram_n_heads;
        for name in ckpt.names() {
            let Some(bytes) = ckpt.stored_bytes(&name)? else {
                w.unknown_tensors += 1;
                continue;
            };
            let elements = if name.ends_with(".scale") {
                0
            } else {
                ckpt.shape(&name)?.iter().product::<usize>() as u64
            };
            match part(&name) {
                Part::Trunk => {
                    w.trunk += bytes;
                    w.dense_elements += elements;
                }
                Part::Head => {
                    w.head += bytes;
                    w.dense_elements += elements;
                }
                Part::Embedding => w.embedding_row += bytes / cfg.vocab_size.max(1) as u64,
                Part::Engram => {
                    let rows = ckpt.shape(&name)?.first().copied().unwrap_or(1).max(1) as u64;
                    w.engram_rows += bytes / rows * engram_cols as u64;
                }
                Part::Expert { layer, expert } => {
                    let e = w.experts.entry((layer, expert)).or_default();
                    e.0 += bytes;
                    e.1 += elements;
                }
                Part::NotRead => {}
            }
        }
        Ok(w)
    }

    /// Bytes of routed expert `expert` of `layer` (0 if the checkpoint has none such).
    pub fn expert(&self, layer: usize, expert: usize) -> u64 {
        self.experts.get(&(layer, expert)).map_or(0, |e| e.0)
    }
}

/// The routed expert sets `[token][layer]` of a flat `experts` record [tokens, layers, k]
/// (a trace's layout; −1 pads a slot without an expert). No layers or k = 0: no tokens.
pub fn routed_sets(flat: &[i64], layers: usize, k: usize) -> Vec<Vec<Vec<usize>>> {
    if layers == 0 || k == 0 {
        return Vec::new();
    }
    flat.chunks(layers * k)
        .map(|token| {
            token
                .chunks(k)
                .map(|slots| {
                    slots
                        .iter()
                        .filter(|&&e| e >= 0)
                        .map(|&e| e as usize)
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The footprint of one decode token, with `experts[t][l]` the routed experts of measured
/// token t at layer l (no token measured: no expert counted).
pub fn footprint(w: &WeightBytes, experts: &[Vec<Vec<usize>>]) -> Footprint {
    let mut f = Footprint {
        trunk: w.trunk,
        head: w.head,
        embedding_row: w.embedding_row,
        engram_rows: w.engram_rows,
        unknown_tensors: w.unknown_tensors,
        multiply_adds: w.dense_elements,
        ..Footprint::default()
    };
    if !experts.is_empty() {
        let (bytes, elements) = experts
            .iter()
            .flat_map(|t| t.iter().enumerate())
            .flat_map(|(l, es)| es.iter().map(move |&e| (l, e)))
            .map(|k| w.experts.get(&k).copied().unwrap_or_default())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        f.routed_experts = bytes / experts.len() as u64;
        f.multiply_adds += elements / experts.len() as u64;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a release checkpoint every stored byte is some tensor's: the tensors' stored bytes
    /// add up to the safetensors data sections. With every expert routed at one token, the
    /// footprint is everything but the embedding rows not looked up and the Engram rows not
    /// selected.
    #[test]
    fn stored_bytes_account_for_every_byte_of_a_release() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        crate::synthetic::generate("tiny", "release", 1, &dir).unwrap();
        let ck = ds41_engine::checkpoint::open(&dir).unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let data = (bytes.len() - 8 - header) as u64;
        let stored: u64 = ck
            .names()
            .iter()
            .map(|n| ck.stored_bytes(n).unwrap().unwrap())
            .sum();
        assert_eq!(stored, data);
        let cfg = ck.config();
        let all: Vec<Vec<usize>> = vec![(0..cfg.n_routed_experts).collect(); cfg.n_layers];
        let f = footprint(&WeightBytes::of(ck.as_ref()).unwrap(), &[all]);
        let embed = ck.stored_bytes("embed.weight").unwrap().unwrap();
        let engram: u64 = ck
            .names()
            .iter()
            .filter(|n| n.contains(".engram.embed."))
            .map(|n| ck.stored_bytes(n).unwrap().unwrap())
            .sum();
        assert_eq!(f.unknown_tensors, 0);
        assert_eq!(
            f.trunk + f.head + f.routed_experts + embed + engram,
            data,
            "{f:?}"
        );
        assert_eq!(f.embedding_row, embed / cfg.vocab_size as u64);
    }

    #[test]
    fn routed_sets_drop_padding_and_keep_token_and_layer_order() {
        let flat = [0, 3, 1, -1, 2, 2, -1, -1];
        assert_eq!(
            routed_sets(&flat, 2, 2),
            vec![vec![vec![0, 3], vec![1]], vec![vec![2, 2], vec![]]]
        );
    }

    #[test]
    fn tensors_go_to_the_part_that_reads_them() {
        assert!(matches!(part("embed.weight"), Part::Embedding));
        assert!(matches!(part("head.weight"), Part::Head));
        assert!(matches!(part("norm.weight"), Part::Head));
        assert!(matches!(part("layers.3.attn.wq_a.scale"), Part::Trunk));
        assert!(matches!(
            part("layers.3.ffn.shared_experts.w1.weight"),
            Part::Trunk
        ));
        assert!(matches!(
            part("layers.2.ffn.experts.7.w2.scale"),
            Part::Expert {
                layer: 2,
                expert: 7
            }
        ));
        assert!(matches!(part("layers.1.engram.embed.weight"), Part::Engram));
        assert!(matches!(part("mtp.0.main_proj.weight"), Part::NotRead));
    }
}
