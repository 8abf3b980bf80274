//! Mutants: a generated checkpoint with exactly one thing removed or corrupted, and the typed
//! reader error it must provoke. The list is data ([`list_mutants`]), so the
//! harness can check "every mutant is refused" without knowing any mutant by name.

use crate::container::WEXP_MAGIC;
use crate::preset::{Preset, Sharding};
use crate::release::{stored_tensors, ReleaseEdit};
use crate::{Layout, SynthError};
use ds41_engine::dsml::json_py::{self, DumpOptions};
use serde_json::{json, Value};
use std::path::Path;

/// The reader error a mutant must provoke: one of `variants` (names of `ds41_engine::Error`
/// variants) whose message contains at least one of `mentions`.
#[derive(Debug, Clone, Copy)]
pub struct Expected {
    pub variants: &'static [&'static str],
    pub mentions: &'static [&'static str],
}

impl Expected {
    /// Whether `err` is the refusal this mutant expects.
    pub fn matches(&self, err: &ds41_engine::Error) -> bool {
        let text = err.to_string();
        self.variants.contains(&err.kind()) && self.mentions.iter().any(|m| text.contains(m))
    }
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Error::{} mentioning {}",
            self.variants.join("|"),
            self.mentions
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        )
    }
}

/// One mutant.
#[derive(Debug, Clone)]
pub struct MutantInfo {
    pub name: &'static str,
    pub description: &'static str,
    pub layouts: &'static [Layout],
    /// Needs the sharded release layout (an index file).
    pub needs_shards: bool,
    /// Needs a native container (WASTE's own container has no `specials.json`).
    pub needs_specials: bool,
    pub expect: Expected,
}

const R: &[Layout] = &[Layout::Release];
const C: &[Layout] = &[Layout::Container];
const RC: &[Layout] = &[Layout::Release, Layout::Container];

const fn m(
    name: &'static str,
    description: &'static str,
    layouts: &'static [Layout],
    variants: &'static [&'static str],
    mentions: &'static [&'static str],
) -> MutantInfo {
    MutantInfo {
        name,
        description,
        layouts,
        needs_shards: false,
        needs_specials: false,
        expect: Expected { variants, mentions },
    }
}

const TENSOR: &[&str] = &["Tensor"];
const CONFIG: &[&str] = &["Config"];
const FORMAT: &[&str] = &["Format"];

/// Every mutant, in listing order.
pub fn list_mutants() -> Vec<MutantInfo> {
    let mut v = vec![
        m("no-attn-sink", "layer 0 has no attention sink (`attn.attn_sink` / `self_attn.attn_sink`)", RC, TENSOR, &["attn_sink"]),
        m("no-compressor-gate", "the first ratio-2 KV source lacks its compressor gate (`compressor.wgate` / `compress.gate_proj`)", RC, TENSOR, &["compressor.wgate", "compress.gate_proj"]),
        m("bad-ratio-chain", "the first KV source's ratio becomes 1, so the next ratio-2 consumer reads a cache of the wrong granularity (MODEL.md §2.2 item 3)", RC, CONFIG, &["compress_ratios"]),
        m("engram-rows-mismatch", "engram_num_embeddings[0] is one more than the sum of that layer's primes (MODEL.md §2.2 item 6)", RC, CONFIG, &["engram_num_embeddings"]),
        m("two-shared-experts", "n_shared_experts / num_shared_experts = 2 (MODEL.md §2.2 item 1)", RC, CONFIG, &["shared_experts"]),
        m("missing-scale", "`layers.0.attn.wq_a.scale` is missing (FP8 weight without its E8M0 companion)", R, TENSOR, &["wq_a"]),
        m("wrong-dtype", "`layers.0.attn.wq_a.weight` is stored as F8_E5M2 instead of F8_E4M3", R, TENSOR, &["layers.0.attn.wq_a"]),
        m("wrong-shape", "`layers.0.attn.wkv.weight` is stored transposed", R, TENSOR, &["layers.0.attn.wkv.weight"]),
        m("wrong-scale-shape", "`layers.0.attn.wq_b.scale` has one column too many", R, TENSOR, &["wq_b"]),
        m("missing-expert", "the last routed expert of the last layer has no `w2`", R, TENSOR, &["ffn.experts."]),
        m("no-engram-table", "the first Engram layer has no `engram.embed.weight`", R, TENSOR, &["engram.embed"]),
        m("file-truncated", "the last safetensors file loses the second half of its data", R, FORMAT, &[".safetensors"]),
        m("header-overflow", "a safetensors header length points past the end of the file", R, FORMAT, &[".safetensors"]),
        m("header-not-json", "a safetensors header is not valid JSON", R, FORMAT, &[".safetensors"]),
        MutantInfo {
            needs_shards: true,
            ..m("index-missing-shard", "model.safetensors.index.json maps a tensor to a shard that does not exist", R, &["Format", "Io", "Tensor"], &["model-00099-of-00099.safetensors"])
        },
        m("bad-format-version", "manifest format_version is 1", C, &["Format", "Config"], &["format_version"]),
        m("no-format-version", "manifest has no format_version", C, &["Format", "Config"], &["format_version"]),
        m("bad-crc", "one payload byte of expert 1 in experts-L0.bin is flipped (the header CRC no longer matches)", C, FORMAT, &["experts-L0.bin"]),
        m("bad-wexp-magic", "expert record 0 of experts-L0.bin has a wrong WEXP magic", C, FORMAT, &["experts-L0.bin"]),
        m("wexp-wrong-expert", "expert record 1 of experts-L0.bin claims expert id 0", C, FORMAT, &["experts-L0.bin"]),
        m("bank-truncated", "the last expert bank loses its last 4 KiB", C, FORMAT, &["experts-L"]),
        m("trunk-truncated", "trunk.bin loses its last 100 bytes", C, FORMAT, &["trunk.bin"]),
        m("bad-codebook-magic", "the first codebook in codebooks.bin has a wrong WCBK magic", C, FORMAT, &["codebooks.bin"]),
        m("engram-table-truncated", "the first Engram table loses its last row", C, FORMAT, &["engram-L"]),
        m("tokmap-short", "engram-tokmap.bin has one id fewer than vocab_size", C, FORMAT, &["engram-tokmap.bin"]),
    ];
    v.push(MutantInfo {
        needs_specials: true,
        ..m("specials-lone-surrogate", "specials.json escapes an unpaired UTF-16 surrogate (`\\ud83d`) that a decoder must reject", C, FORMAT, &["specials.json"])
    });
    v
}

pub fn find(name: &str) -> Option<MutantInfo> {
    list_mutants().into_iter().find(|m| m.name == name)
}

pub fn check_applicable(m: &MutantInfo, p: &Preset, layout: Layout) -> Result<(), SynthError> {
    let bad = |what: String| {
        Err(SynthError::MutantNotApplicable {
            mutant: m.name.to_string(),
            what,
        })
    };
    if !m.layouts.contains(&layout) {
        return bad(format!("the {layout:?} layout"));
    }
    if p.unsupported(layout).is_some() {
        return bad(format!("preset `{}` in the {layout:?} layout", p.name));
    }
    if m.needs_shards && p.sharding != Sharding::ReleaseLike {
        return bad(format!(
            "preset `{}` (not sharded; use tiny-sharded)",
            p.name
        ));
    }
    if m.needs_specials && p.waste_compat {
        return bad(format!(
            "preset `{}` (its container has no specials.json)",
            p.name
        ));
    }
    if p.geometry.engram_layer_ids.is_empty() && m.name.contains("engram") {
        return bad(format!("preset `{}` (no Engram layer)", p.name));
    }
    Ok(())
}

fn first_ratio2_source(p: &Preset) -> usize {
    let g = &p.geometry;
    *g.kv_source_layers
        .iter()
        .find(|&&l| g.compress_ratios[l] > 1)
        .expect("every preset has a ratio-2 KV source")
}

/// Edits made before a release checkpoint is written.
pub fn release_edit(m: &MutantInfo, p: &Preset) -> ReleaseEdit {
    let g = &p.geometry;
    let mut e = ReleaseEdit::default();
    let shape = |name: &str| {
        stored_tensors(g)
            .into_iter()
            .find(|t| t.name == name)
            .map(|t| t.shape)
            .expect("tensor exists")
    };
    match m.name {
        "no-attn-sink" => e.drop.push("layers.0.attn.attn_sink".into()),
        "no-compressor-gate" => e.drop.push(format!(
            "layers.{}.attn.compressor.wgate.weight",
            first_ratio2_source(p)
        )),
        "missing-scale" => e.drop.push("layers.0.attn.wq_a.scale".into()),
        "wrong-dtype" => e
            .retype
            .push(("layers.0.attn.wq_a.weight".into(), "F8_E5M2")),
        "wrong-shape" => {
            let s = shape("layers.0.attn.wkv.weight");
            e.reshape
                .push(("layers.0.attn.wkv.weight".into(), vec![s[1], s[0]]));
        }
        "wrong-scale-shape" => {
            let s = shape("layers.0.attn.wq_b.scale");
            e.reshape
                .push(("layers.0.attn.wq_b.scale".into(), vec![s[0], s[1] + 1]));
        }
        "missing-expert" => e.drop.push(format!(
            "layers.{}.ffn.experts.{}.w2.weight",
            g.n_layers - 1,
            g.n_routed_experts - 1
        )),
        "no-engram-table" => {
            let l = g.engram_layer_ids[0];
            e.drop.push(format!("layers.{l}.engram.embed.weight"));
            e.drop.push(format!("layers.{l}.engram.embed.scale"));
        }
        "bad-ratio-chain" => {
            let mut r = g.compress_ratios.clone();
            r[first_ratio2_source(p)] = 1;
            e.config
                .push(("compress_ratios", "compress_ratios", json!(r)));
        }
        "engram-rows-mismatch" => {
            let mut rows = crate::inventory::engram_rows(g);
            rows[0] += 1;
            e.config.push((
                "engram_num_embeddings",
                "engram_num_embeddings",
                json!(rows),
            ));
        }
        "two-shared-experts" => e
            .config
            .push(("n_shared_experts", "n_shared_experts", json!(2))),
        _ => {}
    }
    e
}

fn read(path: &Path) -> Result<Vec<u8>, SynthError> {
    std::fs::read(path).map_err(|e| SynthError::io(path, e))
}
fn write(path: &Path, b: &[u8]) -> Result<(), SynthError> {
    std::fs::write(path, b).map_err(|e| SynthError::io(path, e))
}
fn json_of(path: &Path) -> Result<Value, SynthError> {
    serde_json::from_slice(&read(path)?).map_err(|e| SynthError::Invalid {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Edits made to the files after writing (byte corruption, manifest and index edits).
pub fn apply_after(
    m: &MutantInfo,
    p: &Preset,
    layout: Layout,
    dir: &Path,
    files: &[String],
) -> Result<(), SynthError> {
    let g = &p.geometry;
    let last_st = || {
        files
            .iter()
            .filter(|f| f.ends_with(".safetensors"))
            .max()
            .cloned()
            .expect("a safetensors file")
    };
    match (layout, m.name) {
        (Layout::Release, "file-truncated") => {
            let path = dir.join(last_st());
            let b = read(&path)?;
            let hlen = u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as usize;
            let data = b.len() - 8 - hlen;
            write(&path, &b[..8 + hlen + data / 2])?;
        }
        (Layout::Release, "header-overflow") => {
            let path = dir.join(last_st());
            let mut b = read(&path)?;
            let too_long = b.len() as u64 + 1;
            b[..8].copy_from_slice(&too_long.to_le_bytes());
            write(&path, &b)?;
        }
        (Layout::Release, "header-not-json") => {
            let path = dir.join(last_st());
            let mut b = read(&path)?;
            b[8] = b'#';
            write(&path, &b)?;
        }
        (Layout::Release, "index-missing-shard") => {
            let path = dir.join("model.safetensors.index.json");
            let mut v = json_of(&path)?;
            v["weight_map"]["layers.0.attn.wq_a.weight"] =
                json!("model-00099-of-00099.safetensors");
            crate::release::write_json(&path, &v)?;
        }
        (Layout::Container, name) => apply_container(name, p, dir, g)?,
        _ => {}
    }
    Ok(())
}

fn edit_manifest(dir: &Path, f: impl FnOnce(&mut Value)) -> Result<(), SynthError> {
    let path = dir.join("manifest.json");
    let mut v = json_of(&path)?;
    f(&mut v);
    write(
        &path,
        json_py::dumps_with(&v, DumpOptions::file(1)).as_bytes(),
    )
}

fn drop_trunk_entry(v: &mut Value, name: &str) {
    if let Some(Value::Array(t)) = v.get_mut("trunk") {
        t.retain(|e| e["name"] != name);
    }
}

fn apply_container(
    name: &str,
    p: &Preset,
    dir: &Path,
    g: &crate::preset::Geometry,
) -> Result<(), SynthError> {
    let rec = crate::container::record_size(g, p.expert_codes);
    let bank = |l: usize| dir.join(format!("experts-L{l}.bin"));
    match name {
        "no-attn-sink" => edit_manifest(dir, |v| {
            drop_trunk_entry(v, "model.layers.0.self_attn.attn_sink")
        }),
        "no-compressor-gate" => {
            let n = format!(
                "model.layers.{}.self_attn.compress.gate_proj.weight",
                first_ratio2_source(p)
            );
            edit_manifest(dir, |v| drop_trunk_entry(v, &n))
        }
        "bad-ratio-chain" => {
            let mut r = g.compress_ratios.clone();
            r[first_ratio2_source(p)] = 1;
            edit_manifest(dir, |v| v["config"]["compress_ratios"] = json!(r))
        }
        "engram-rows-mismatch" => edit_manifest(dir, |v| {
            let n = v["config"]["engram_num_embeddings"][0]
                .as_u64()
                .unwrap_or(0);
            v["config"]["engram_num_embeddings"][0] = json!(n + 1);
        }),
        "two-shared-experts" => {
            edit_manifest(dir, |v| v["config"]["num_shared_experts"] = json!(2))
        }
        "bad-format-version" => edit_manifest(dir, |v| v["format_version"] = json!(1)),
        "no-format-version" => edit_manifest(dir, |v| {
            if let Some(o) = v.as_object_mut() {
                o.remove("format_version");
            }
        }),
        "bad-crc" => {
            let mut b = read(&bank(0))?;
            b[rec + 48 + 5] ^= 0x01;
            write(&bank(0), &b)
        }
        "bad-wexp-magic" => {
            let mut b = read(&bank(0))?;
            b[..4].copy_from_slice(&(WEXP_MAGIC ^ 0xFF).to_le_bytes());
            write(&bank(0), &b)
        }
        "wexp-wrong-expert" => {
            let mut b = read(&bank(0))?;
            b[rec + 6..rec + 8].copy_from_slice(&0u16.to_le_bytes());
            write(&bank(0), &b)
        }
        "bank-truncated" => {
            let path = bank(g.n_layers - 1);
            let b = read(&path)?;
            write(&path, &b[..b.len() - 4096])
        }
        "trunk-truncated" => {
            let path = dir.join("trunk.bin");
            let b = read(&path)?;
            write(&path, &b[..b.len() - 100])
        }
        "bad-codebook-magic" => {
            let path = dir.join("codebooks.bin");
            let mut b = read(&path)?;
            b[0] ^= 0xFF;
            write(&path, &b)
        }
        "engram-table-truncated" => {
            let path = dir.join(format!("engram-L{}.bin", g.engram_layer_ids[0]));
            let b = read(&path)?;
            let rb = crate::container::row_bytes(g.engram_head_dim);
            write(&path, &b[..b.len() - rb])
        }
        "tokmap-short" => {
            let path = dir.join("engram-tokmap.bin");
            let b = read(&path)?;
            write(&path, &b[..b.len() - 4])
        }
        "specials-lone-surrogate" => {
            let path = dir.join("specials.json");
            let text = String::from_utf8_lossy(&read(&path)?).into_owned();
            // Replace the first escaped U+FF5C by an unpaired high surrogate.
            write(&path, text.replacen("\\uff5c", "\\ud83d", 1).as_bytes())
        }
        _ => Ok(()),
    }
}

/// Open `dir` the strictest way the readers offer and touch everything a forward pass could:
/// every tensor (dequantised), every expert record (with its CRC checked), the Engram
/// constants and token map. Returns the number of tensors read, or the first refusal.
/// This is what "the readers refuse a mutant" means, for tests and for the harness.
pub fn read_everything(dir: &Path) -> Result<usize, ds41_engine::Error> {
    use ds41_engine::checkpoint::{
        self, container::ContainerOptions, Checkpoint, ContainerCheckpoint,
    };
    let ck: Box<dyn Checkpoint> = match checkpoint::detect_layout(dir)? {
        Layout::Container => Box::new(ContainerCheckpoint::open_with(
            dir,
            ContainerOptions { verify_crc: true },
        )?),
        Layout::Release => checkpoint::open(dir)?,
    };
    let names = ck.names();
    for n in &names {
        ck.tensor_f32(n)?;
    }
    if !ck.config().engram_layer_ids.is_empty() {
        ck.engram_constants()?;
    }
    ck.engram_token_map()?;
    Ok(names.len())
}
