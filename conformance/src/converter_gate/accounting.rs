//! Tensor accounting: every release tensor is renamed into the container (CONTAINER.md §8) or
//! deliberately dropped (MTP stages; `.scale` companions folded into the requantised weight),
//! and the container holds nothing the release does not. Read from the manifest itself, not
//! through the container reader, so that a container the reader refuses (a tensor missing) is
//! still accounted for, every missing name listed.

use std::collections::BTreeMap;

use ds41_engine::checkpoint::names::{
    container_to_release, expert_name, release_to_container, ContainerName,
};
use ds41_engine::checkpoint::Checkpoint;
use serde::Serialize;
use serde_json::Value;

/// Where a canonical tensor lives in the container, as the manifest states it.
#[derive(Debug, Clone, Serialize)]
pub struct Placed {
    /// The container's own name (trunk name, `experts-L{l}.bin[e].kind`, `engram-L{l}.bin`).
    pub container: String,
    /// Stated shape (`None` for an expert matrix, whose shape the config fixes).
    pub shape: Option<Vec<usize>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Named {
    pub name: String,
    pub why: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Accounting {
    pub release_tensors: usize,
    /// Release tensors that are not `.scale` companions ("real names").
    pub real_names: usize,
    pub scale_companions: usize,
    pub renamed_trunk: usize,
    pub renamed_expert_matrices: usize,
    pub renamed_engram_tables: usize,
    /// Deliberately not carried over (MTP stages).
    pub dropped: Vec<Named>,
    /// Release tensors with no container name at all.
    pub unrenamed: Vec<String>,
    /// Release tensors whose container place is absent from the manifest.
    pub missing: Vec<Named>,
    /// Container tensors that no release tensor maps to.
    pub extra: Vec<Named>,
    /// Present in both with different shapes.
    pub shape_mismatch: Vec<Named>,
    /// Release names present in both with the same shape: the round-trip set.
    #[serde(skip)]
    pub paired: Vec<String>,
}

impl Accounting {
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.unrenamed {
            out.push(format!(
                "`{n}`: release tensor with no container name (CONTAINER.md §8)"
            ));
        }
        for m in self
            .missing
            .iter()
            .chain(&self.extra)
            .chain(&self.shape_mismatch)
        {
            out.push(format!("`{}`: {}", m.name, m.why));
        }
        out
    }
}

/// The canonical names a manifest places, read leniently (bad entries are reported by the
/// container reader; here they are skipped with a note in `notes`).
pub fn manifest_places(
    manifest: &Value,
    n_experts_fallback: usize,
    notes: &mut Vec<String>,
) -> (BTreeMap<String, Placed>, Vec<Named>) {
    let mut placed = BTreeMap::new();
    let mut extra = Vec::new();
    let prefix = manifest
        .get("tensor_prefix")
        .and_then(Value::as_str)
        .unwrap_or("");
    let shape_of = |v: &Value| -> Option<Vec<usize>> {
        v.as_array()?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect()
    };
    match manifest.get("trunk").and_then(Value::as_array) {
        Some(trunk) => {
            for (i, e) in trunk.iter().enumerate() {
                let Some(name) = e.get("name").and_then(Value::as_str) else {
                    notes.push(format!("manifest trunk[{i}]: no `name`"));
                    continue;
                };
                let Some(local) = name.strip_prefix(prefix) else {
                    extra.push(Named {
                        name: name.into(),
                        why: format!("trunk tensor outside the tensor_prefix `{prefix}`"),
                    });
                    continue;
                };
                match container_to_release(local) {
                    Some(r) => {
                        placed.insert(
                            r,
                            Placed {
                                container: name.into(),
                                shape: e.get("shape").and_then(shape_of),
                            },
                        );
                    }
                    None => extra.push(Named {
                        name: name.into(),
                        why: "container trunk tensor with no release name (CONTAINER.md §8)".into(),
                    }),
                }
            }
        }
        None => notes.push("manifest: no `trunk` list".into()),
    }
    if let Some(layers) = manifest.get("layers").and_then(Value::as_object) {
        for (k, v) in layers {
            let Ok(l) = k.parse::<usize>() else {
                notes.push(format!("manifest layers: key {k:?} is not a layer id"));
                continue;
            };
            let experts = v
                .get("experts")
                .and_then(Value::as_u64)
                .map_or(n_experts_fallback, |e| e as usize);
            let file = v
                .get("file")
                .and_then(Value::as_str)
                .unwrap_or("experts-L?.bin");
            for e in 0..experts {
                for (kind, kname) in ["gate", "up", "down"].iter().enumerate() {
                    placed.insert(
                        expert_name(l, e, kind),
                        Placed {
                            container: format!("{file} record {e} {kname}"),
                            shape: None,
                        },
                    );
                }
            }
        }
    }
    if let Some(engram) = manifest.get("engram").and_then(Value::as_object) {
        for (k, v) in engram {
            let Ok(l) = k.parse::<usize>() else {
                notes.push(format!("manifest engram: key {k:?} is not a layer id"));
                continue;
            };
            let dim = |key: &str| v.get(key).and_then(Value::as_u64).map(|x| x as usize);
            placed.insert(
                format!("layers.{l}.engram.embed.weight"),
                Placed {
                    container: format!("engram-L{l}.bin"),
                    shape: dim("rows").zip(dim("dim")).map(|(r, d)| vec![r, d]),
                },
            );
        }
    }
    (placed, extra)
}

/// Account for every release tensor against the manifest's places.
pub fn account(
    release: &dyn Checkpoint,
    placed: &BTreeMap<String, Placed>,
    extra: Vec<Named>,
) -> Accounting {
    let names = release.names();
    let mut a = Accounting {
        release_tensors: names.len(),
        extra,
        ..Accounting::default()
    };
    for n in &names {
        if n.starts_with("mtp.") {
            a.real_names += usize::from(!n.ends_with(".scale"));
            a.scale_companions += usize::from(n.ends_with(".scale"));
            a.dropped.push(Named {
                name: n.clone(),
                why: "MTP stage (CONTAINER.md §8)".into(),
            });
            continue;
        }
        if let Some(stem) = n.strip_suffix(".scale") {
            if release.contains(&format!("{stem}.weight")) {
                a.scale_companions += 1;
                continue;
            }
        }
        a.real_names += 1;
        let kind = release_to_container(n);
        match kind {
            ContainerName::NotStored => {
                a.unrenamed.push(n.clone());
                continue;
            }
            ContainerName::Trunk(_) => a.renamed_trunk += 1,
            ContainerName::Expert { .. } => a.renamed_expert_matrices += 1,
            ContainerName::EngramTable { .. } => a.renamed_engram_tables += 1,
        }
        let Some(p) = placed.get(n) else {
            let place = match kind {
                ContainerName::Trunk(c) => format!("trunk tensor `{c}`"),
                ContainerName::Expert {
                    layer,
                    expert,
                    kind,
                } => format!(
                    "record {expert} ({}) of experts-L{layer}.bin",
                    ["gate", "up", "down"][kind]
                ),
                ContainerName::EngramTable { layer } => format!("engram-L{layer}.bin"),
                ContainerName::NotStored => unreachable!(),
            };
            a.missing.push(Named {
                name: n.clone(),
                why: format!("missing from the container (expected as {place})"),
            });
            continue;
        };
        let shape = release.shape(n).unwrap_or_default();
        match &p.shape {
            Some(s) if *s != shape => a.shape_mismatch.push(Named {
                name: n.clone(),
                why: format!(
                    "the container's `{}` has shape {s:?}, the release {shape:?}",
                    p.container
                ),
            }),
            _ => a.paired.push(n.clone()),
        }
    }
    for (n, p) in placed {
        if !release.contains(n) {
            a.extra.push(Named {
                name: n.clone(),
                why: format!(
                    "the container's `{}` has no release tensor to come from",
                    p.container
                ),
            });
        }
    }
    a
}
