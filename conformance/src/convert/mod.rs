//! Release → WASTE v0 container conversion (`ds41 convert`), the project's own converter:
//! what the converter gate (`ds41 gate converter`) is proven on.
//!
//! * Trunk (CONTAINER.md §3): Q8G for the embedding, the head and the `hc_*_fn` mixes, and by
//!   default for the other matrices too (`--trunk-bits 4`: Q4G for those, WASTE's choice;
//!   on the synthetic presets it moves attention outputs and index selections well beyond
//!   the `quantized` profile, see gates/README.md), F32 for vectors, the Engram
//!   `q_weight`/`k_weight`, and tensors under `--f32-below` elements (WASTE's converter
//!   keeps tensors under 65,536 in F32).
//! * Experts (§4–§5): VQ3R, codebooks fit per (layer, kind) by deterministic k-means
//!   ([`vq`]); one expert matrix is read at a time, twice (sample, then encode).
//! * Engram (§6): tables requantised to 4 or 8 bits in groups of 32; `engram.json` from the
//!   release's hash constants with the pad as its compressed id; `engram-tokmap.bin` from the
//!   release's token map (shipped, or built from its tokenizer.json).
//! * Manifest: the release config with the text keys at the top, the HF wrapper under
//!   `_outer`, and WASTE's normalised MoE keys (§2, §9). MTP stages and `.scale` companions
//!   are dropped (§8).
//! * Vision (§7–§8): the tower, aligner and span delimiters are trunk tensors like the rest
//!   (`vision_tower.*`, `mm_projector.*`, `model.image_*`); `vision.json` holds the tower's
//!   config, the language model's width and the image token.
//!
//! Every tensor is dequantised exactly by the engine's release reader, a row range or one
//! expert matrix at a time; nothing holds the whole checkpoint.

pub mod defects;
pub mod quantise;
pub mod vq;

use std::io::Write;
use std::path::{Path, PathBuf};

use ds41_engine::checkpoint::names::{
    expected_tensors, expert_name, release_to_container, ContainerName,
};
use ds41_engine::checkpoint::{self, Checkpoint, Layout};
use ds41_engine::config::Config;
use ds41_engine::dsml::json_py::{self, DumpOptions};
use ds41_engine::model::TokenMap;
use ds41_synthetic::container::{
    codebook_record, expert_record, pack_grouped, record_bytes, ExpertCodes, Fmt, ENGRAM_GROUP,
    ENTRIES, GROUP, INDEX_BLOCK, STAGES, VEC_DIM,
};
use serde_json::{json, Map, Value};

pub use defects::{ConverterDefect, DEFECTS};
use quantise::quantise_rows;
use vq::{encode_matrix, row_rms, Codebooks, VqParams};

/// Conversion settings.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Bits of the bulk of the trunk: 8 (Q8G, the default) or 4 (Q4G, WASTE's choice).
    pub trunk_bits: u8,
    /// Engram table bits (4 or 8).
    pub engram_bits: u8,
    /// Trunk tensors with fewer elements stay F32 (0: only vectors and the Engram
    /// `q_weight`/`k_weight`).
    pub f32_below: usize,
    pub vq: VqParams,
    /// A deliberate mistake (negative control of the converter gate).
    pub defect: Option<ConverterDefect>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            trunk_bits: 8,
            engram_bits: 4,
            f32_below: 0,
            vq: VqParams::default(),
            defect: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Engine(#[from] ds41_engine::Error),
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}: not a release checkpoint (a WASTE container); `ds41 convert` reads the release layout")]
    NotRelease(PathBuf),
    #[error("{0}: the output directory is not empty; give a new or empty directory (nothing in it is overwritten)")]
    OutNotEmpty(PathBuf),
    #[error("tensor `{tensor}`: {reason}")]
    Tensor { tensor: String, reason: String },
    #[error("{field}: {reason}")]
    Unsupported { field: String, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ConvertError + '_ {
    move |error| ConvertError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// What was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Converted {
    pub trunk_tensors: usize,
    pub expert_layers: usize,
    pub experts: usize,
    pub engram_tables: usize,
    /// Release tensors not carried over, with the reason (CONTAINER.md §8).
    pub dropped: Vec<(String, &'static str)>,
    pub files: Vec<String>,
}

/// Trunk storage of a release tensor (module doc).
fn trunk_format(name: &str, shape: &[usize], o: &ConvertOptions) -> Fmt {
    let n: usize = shape.iter().product();
    let hc_fn = name.ends_with("hc_attn_fn") || name.ends_with("hc_ffn_fn");
    if shape.len() < 2
        || n < o.f32_below
        || name.ends_with("engram.q_weight")
        || name.ends_with("engram.k_weight")
    {
        Fmt::F32
    } else if hc_fn || name == "embed.weight" || name == "head.weight" || o.trunk_bits == 8 {
        Fmt::Q8G
    } else {
        Fmt::Q4G
    }
}

/// A file written front to back, counting its bytes.
struct Out {
    path: PathBuf,
    w: std::io::BufWriter<std::fs::File>,
    len: usize,
}

impl Out {
    fn create(path: PathBuf) -> Result<Out, ConvertError> {
        let f = std::fs::File::create(&path).map_err(io(&path))?;
        Ok(Out {
            w: std::io::BufWriter::with_capacity(1 << 20, f),
            path,
            len: 0,
        })
    }
    fn put(&mut self, b: &[u8]) -> Result<(), ConvertError> {
        self.w.write_all(b).map_err(io(&self.path))?;
        self.len += b.len();
        Ok(())
    }
    fn finish(mut self) -> Result<usize, ConvertError> {
        self.w.flush().map_err(io(&self.path))?;
        Ok(self.len)
    }
}

/// `[rows, cols]` of a tensor as the readers view it (rank 1: one row).
fn rows_cols(shape: &[usize]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1);
    (shape.iter().product::<usize>() / cols.max(1), cols)
}

/// Rows per read, so one read holds about a million values.
fn chunk_rows(cols: usize) -> usize {
    ((1 << 20) / cols.max(1)).max(1)
}

/// Convert the release in `release` into a new container in `out`.
pub fn convert(release: &Path, out: &Path, o: &ConvertOptions) -> Result<Converted, ConvertError> {
    for (field, bits) in [
        ("--trunk-bits", o.trunk_bits),
        ("--engram-bits", o.engram_bits),
    ] {
        if !matches!(bits, 4 | 8) {
            return Err(ConvertError::Unsupported {
                field: field.into(),
                reason: format!("must be 4 or 8, got {bits}"),
            });
        }
    }
    let ckpt = checkpoint::open(release)?;
    if ckpt.layout() != Layout::Release {
        return Err(ConvertError::NotRelease(release.to_path_buf()));
    }
    let cfg = ckpt.config().clone();
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(io(out))?;
        if entries.next().is_some() {
            return Err(ConvertError::OutNotEmpty(out.to_path_buf()));
        }
    }
    // Written into a fresh sibling directory and moved to `out` when complete, so a failed or
    // interrupted conversion never leaves a partial container under the name asked for.
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let name = out
        .file_name()
        .map_or("container".into(), |n| n.to_string_lossy().into_owned());
    let staging = Staging(parent.join(format!(".{name}.ds41-convert-{}", std::process::id())));
    // (A directory made by create_dir gets the user's usual permissions, unlike a tempdir.)
    std::fs::create_dir(&staging.0).map_err(io(&staging.0))?;
    let final_out = out;
    let out = staging.0.as_path();
    let ckpt = ckpt.as_ref();

    let mut done = Converted {
        trunk_tensors: 0,
        expert_layers: 0,
        experts: 0,
        engram_tables: 0,
        dropped: Vec::new(),
        files: Vec::new(),
    };
    let names = ckpt.names();
    for n in &names {
        if let ContainerName::NotStored = release_to_container(n) {
            let why = if n.starts_with("mtp.") {
                "MTP stage (CONTAINER.md §8)"
            } else if n.ends_with(".scale") {
                "scale companion, folded into the requantised weight"
            } else {
                "no container name (CONTAINER.md §8)"
            };
            done.dropped.push((n.clone(), why));
        }
    }

    let trunk = write_trunk(ckpt, &names, out, o, &mut done)?;
    let (layers, codebooks) = write_experts(ckpt, &cfg, out, o, &mut done)?;
    let (engram, rows) = write_engram(ckpt, &cfg, release, out, o, &mut done)?;
    std::fs::write(out.join("codebooks.bin"), &codebooks)
        .map_err(io(&out.join("codebooks.bin")))?;
    done.files.push("codebooks.bin".into());

    let config_path = release.join("config.json");
    let root: Value = serde_json::from_slice(
        &std::fs::read(&config_path).map_err(io(&config_path))?,
    )
    .map_err(|e| ConvertError::Unsupported {
        field: config_path.display().to_string(),
        reason: format!("not JSON: {e}"),
    })?;
    let manifest = json!({
        "format_version": 0,
        "arch": "deepseek_v41_text",
        "tensor_prefix": "",
        "config": container_config(&root, &cfg, &rows),
        "expert_quant": {"fmt": "VQ3R", "stages": STAGES, "vec_dim": VEC_DIM, "entries": ENTRIES,
                          "index_block": INDEX_BLOCK, "bits_per_weight": 3},
        "layers": layers,
        "trunk": trunk,
        "engram": engram,
    });
    let path = out.join("manifest.json");
    std::fs::write(&path, json_py::dumps_with(&manifest, DumpOptions::file(1)))
        .map_err(io(&path))?;
    done.files.push("manifest.json".into());
    write_vision(&root, &cfg, out, &mut done)?;
    done.files.sort();
    if final_out.exists() {
        // Checked empty above; rename(2) does not replace a directory on every platform.
        std::fs::remove_dir(final_out).map_err(io(final_out))?;
    }
    std::fs::rename(&staging.0, final_out).map_err(io(final_out))?;
    Ok(done)
}

/// `vision.json` (CONTAINER.md §7) for a release with a vision tower: its `vision_config`
/// keys, `"tower": "ds41"`, the language model's width and the image token. (The tower's
/// tensors are ordinary trunk tensors, `vision_tower.*` / `mm_projector.*` / `model.image_*`.)
fn write_vision(
    root: &Value,
    cfg: &Config,
    out: &Path,
    done: &mut Converted,
) -> Result<(), ConvertError> {
    let (Some(Value::Object(tower)), Some(id)) = (root.get("vision_config"), cfg.image_token_id)
    else {
        return Ok(());
    };
    if cfg.vision.as_ref().is_none_or(|v| v.n_layers == 0) {
        return Ok(());
    }
    let mut vision = Map::new();
    vision.insert("tower".into(), json!("ds41"));
    vision.extend(
        tower
            .iter()
            .filter(|(k, _)| k.as_str() != "model_type")
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    vision.insert("out_hidden_size".into(), json!(cfg.dim));
    vision.insert("media_placeholder_token_id".into(), json!(id));
    let path = out.join("vision.json");
    std::fs::write(
        &path,
        json_py::dumps_with(&Value::Object(vision), DumpOptions::file(1)),
    )
    .map_err(io(&path))?;
    done.files.push("vision.json".into());
    Ok(())
}

/// A staging directory, removed with its contents unless it was renamed into place.
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The manifest `config`: text keys at the top, the HF wrapper under `_outer`, WASTE's
/// normalised keys (CONTAINER.md §2, §9).
fn container_config(root: &Value, cfg: &Config, engram_rows: &[u64]) -> Value {
    let mut top: Map<String, Value> = match root.get("text_config") {
        Some(Value::Object(t)) => t.clone(),
        _ => root.as_object().cloned().unwrap_or_default(),
    };
    if root.get("text_config").is_some() {
        top.insert("_outer".into(), root.clone());
    }
    top.insert("num_experts".into(), json!(cfg.n_routed_experts));
    top.insert(
        "num_experts_per_token".into(),
        json!(cfg.n_activated_experts),
    );
    top.insert("num_shared_experts".into(), json!(cfg.n_shared_experts));
    top.insert("moe_renormalize".into(), json!(cfg.norm_topk_prob));
    top.insert("routing_bias_vl".into(), json!(cfg.routing_bias_vl));
    top.insert("engram_num_embeddings".into(), json!(engram_rows));
    top.insert(
        "engram_compressed_vocab_size".into(),
        json!(cfg.engram_compressed_vocab_size),
    );
    Value::Object(top)
}

fn write_trunk(
    ckpt: &dyn Checkpoint,
    names: &[String],
    out: &Path,
    o: &ConvertOptions,
    done: &mut Converted,
) -> Result<Vec<Value>, ConvertError> {
    // Checkpoint order (expected tensors), then any other trunk tensor (vision, image markers).
    let mut order: Vec<String> = expected_tensors(ckpt.config())
        .into_iter()
        .map(|t| t.name)
        .filter(|n| matches!(release_to_container(n), ContainerName::Trunk(_)))
        .collect();
    let mut rest: Vec<String> = names
        .iter()
        .filter(|n| {
            matches!(release_to_container(n), ContainerName::Trunk(_)) && !order.contains(n)
        })
        .cloned()
        .collect();
    rest.sort();
    order.extend(rest);

    let mut trunk = Out::create(out.join("trunk.bin"))?;
    done.files.push("trunk.bin".into());
    let mut entries = Vec::new();
    for name in order {
        let ContainerName::Trunk(cname) = release_to_container(&name) else {
            unreachable!("filtered above")
        };
        if o.defect == Some(ConverterDefect::DroppedTensor) && name == "layers.0.attn.wq_b.weight" {
            continue;
        }
        let mut shape = ckpt.shape(&name)?;
        let fmt = trunk_format(&name, &shape, o);
        let (rows, cols) = rows_cols(&shape);
        let transposed = o.defect == Some(ConverterDefect::TransposedTrunk)
            && name == "layers.0.attn.wq_a.weight";
        let whole_t = if transposed {
            let w = ckpt.tensor_f32(&name)?;
            shape = vec![cols, rows];
            Some(
                (0..cols)
                    .flat_map(|c| (0..rows).map(move |r| (r, c)))
                    .map(|(r, c)| w[r * cols + c])
                    .collect::<Vec<f32>>(),
            )
        } else {
            None
        };
        let (rows, cols) = rows_cols(&shape);
        let off = trunk.len;
        let mut e = Map::new();
        e.insert("name".into(), json!(cname));
        let wrong_dtype = o.defect == Some(ConverterDefect::WrongDtype)
            && name == "layers.0.attn.wkv.weight"
            && fmt == Fmt::Q8G;
        let declared = if wrong_dtype { Fmt::Q4G } else { fmt };
        e.insert("fmt".into(), json!(declared as u8));
        e.insert("off".into(), json!(off));
        e.insert("shape".into(), json!(shape));
        let groups = cols.div_ceil(GROUP);
        let padded = groups * GROUP;
        let mut scales: Vec<u16> = Vec::new();
        let step = chunk_rows(cols);
        let mut buf = Vec::new();
        for first in (0..rows).step_by(step) {
            let n = step.min(rows - first);
            buf.resize(n * cols, 0.0);
            match &whole_t {
                Some(w) => buf.copy_from_slice(&w[first * cols..(first + n) * cols]),
                None => ckpt.rows_f32(&name, first, &mut buf)?,
            }
            match fmt {
                Fmt::F32 => {
                    let bytes: Vec<u8> = buf.iter().flat_map(|x| x.to_le_bytes()).collect();
                    trunk.put(&bytes)?;
                }
                Fmt::Q8G | Fmt::Q4G => {
                    let bits = if fmt == Fmt::Q8G { 8 } else { 4 };
                    let q = quantise_rows(&buf, cols, padded, GROUP, bits).map_err(|(r, c)| {
                        ConvertError::Tensor {
                            tensor: name.clone(),
                            reason: format!(
                                "row {} from column {c}: a value is not finite or too large for an f16 group scale",
                                first + r
                            ),
                        }
                    })?;
                    let mut codes = pack_grouped(&q.ints, bits);
                    if wrong_dtype {
                        // Int8 codes where Q4G nibbles are declared: as many bytes as Q4G needs.
                        codes.truncate(codes.len() / 2);
                    }
                    trunk.put(&codes)?;
                    scales.extend(q.scales);
                }
            }
        }
        if fmt != Fmt::F32 {
            if o.defect == Some(ConverterDefect::MisScaledTrunk)
                && name == "layers.1.attn.wo_b.weight"
            {
                for s in &mut scales {
                    *s = half::f16::from_f32(2.0 * half::f16::from_bits(*s).to_f32()).to_bits();
                }
            }
            e.insert("group".into(), json!(GROUP));
            e.insert("scale_off".into(), json!(trunk.len));
            let bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
            trunk.put(&bytes)?;
        }
        e.insert("bytes".into(), json!(trunk.len - off));
        entries.push(Value::Object(e));
        done.trunk_tensors += 1;
    }
    trunk.finish()?;
    Ok(entries)
}

/// An expert matrix as the converter encodes it (the defects change what is read).
fn expert_values(
    ckpt: &dyn Checkpoint,
    o: &ConvertOptions,
    n_layers: usize,
    l: usize,
    e: usize,
    kind: usize,
    (m, n): (usize, usize),
) -> Result<Vec<f32>, ConvertError> {
    let source = match o.defect {
        Some(ConverterDefect::SwappedExperts) if l + 1 == n_layers && e < 2 => 1 - e,
        _ => e,
    };
    let name = expert_name(l, source, kind);
    let shape = ckpt.shape(&name)?;
    if shape != [m, n] {
        return Err(ConvertError::Tensor {
            tensor: name,
            reason: format!("shape {shape:?}, the config implies [{m}, {n}]"),
        });
    }
    let w = ckpt.tensor_f32(&name)?;
    if o.defect == Some(ConverterDefect::TransposedExpert) && (l, e, kind) == (0, 1, 2) {
        // The [n, m] transpose, laid out row-major and stored as if it were [m, n].
        return Ok((0..n)
            .flat_map(|c| (0..m).map(move |r| (r, c)))
            .map(|(r, c)| w[r * n + c])
            .collect());
    }
    Ok(w)
}

fn write_experts(
    ckpt: &dyn Checkpoint,
    cfg: &Config,
    out: &Path,
    o: &ConvertOptions,
    done: &mut Converted,
) -> Result<(Map<String, Value>, Vec<u8>), ConvertError> {
    let (i, d) = (cfg.moe_inter_dim, cfg.dim);
    if i % VEC_DIM != 0 || d % VEC_DIM != 0 {
        return Err(ConvertError::Unsupported {
            field: "moe_intermediate_size / hidden_size".into(),
            reason: format!("VQ3R needs both to be multiples of {VEC_DIM}, got {i} and {d}"),
        });
    }
    let kinds = [(i, d), (i, d), (d, i)];
    let rec = record_bytes(i, d, ExpertCodes::VQ3R);
    let mut layers = Map::new();
    let mut codebooks = Vec::new();
    let experts = cfg.n_routed_experts;
    for l in 0..cfg.n_layers {
        let base = l * 3 * STAGES;
        let mut books = Vec::with_capacity(3);
        for (k, &(m, n)) in kinds.iter().enumerate() {
            let nv = n / VEC_DIM;
            let total = experts * m * nv;
            let stride = total.div_ceil(o.vq.max_train.max(1)).max(1);
            let mut train = Vec::new();
            for e in 0..experts {
                let w = expert_values(ckpt, o, cfg.n_layers, l, e, k, (m, n))?;
                for (r, row) in w.chunks_exact(n).enumerate() {
                    let rms = row_rms(row);
                    if rms == 0.0 {
                        continue;
                    }
                    for v in 0..nv {
                        if ((e * m + r) * nv + v).is_multiple_of(stride) {
                            train.extend(
                                row[v * VEC_DIM..(v + 1) * VEC_DIM].iter().map(|x| x / rms),
                            );
                        }
                    }
                }
            }
            books.push(Codebooks::fit(&train, &o.vq, &format!("L{l}.k{k}")));
        }
        let file = format!("experts-L{l}.bin");
        let mut bank = Out::create(out.join(&file))?;
        done.files.push(file.clone());
        for e in 0..experts {
            let mut idx = Vec::with_capacity(3);
            let mut scales = Vec::with_capacity(3);
            for (k, &(m, n)) in kinds.iter().enumerate() {
                let w = expert_values(ckpt, o, cfg.n_layers, l, e, k, (m, n))?;
                let enc = encode_matrix(&books[k], &w, n);
                idx.push(enc.idx);
                scales.push(enc.scales);
            }
            let mut record =
                expert_record(l, e, base, rec, kinds, ExpertCodes::VQ3R, &idx, &scales);
            if o.defect == Some(ConverterDefect::StaleCrc) && (l, e) == (0, 2) {
                record[48] ^= 1; // a payload byte changed after the CRC was taken
            }
            bank.put(&record)?;
            done.experts += 1;
        }
        let bytes = bank.finish()?;
        for (k, b) in books.iter().enumerate() {
            for s in 0..STAGES {
                let mut bits = b.f16_bits(s);
                if o.defect == Some(ConverterDefect::MisScaledCodebook) && (l, k, s) == (0, 0, 0) {
                    for x in &mut bits {
                        *x = half::f16::from_f32(2.0 * half::f16::from_bits(*x).to_f32()).to_bits();
                    }
                }
                codebooks.extend(codebook_record(base + k * STAGES + s, &bits));
            }
        }
        layers.insert(
            l.to_string(),
            json!({"file": file, "experts": experts, "bytes": bytes, "codebook_base": base}),
        );
        done.expert_layers += 1;
    }
    Ok((layers, codebooks))
}

/// Engram tables, `engram.json` and `engram-tokmap.bin`; returns the manifest's `engram`
/// object and the rows per table.
fn write_engram(
    ckpt: &dyn Checkpoint,
    cfg: &Config,
    release: &Path,
    out: &Path,
    o: &ConvertOptions,
    done: &mut Converted,
) -> Result<(Map<String, Value>, Vec<u64>), ConvertError> {
    let mut manifest = Map::new();
    let mut rows_all = Vec::new();
    if cfg.engram_layer_ids.is_empty() {
        return Ok((manifest, rows_all));
    }
    let dim = cfg.engram_head_dim;
    if !dim.is_multiple_of(ENGRAM_GROUP) {
        return Err(ConvertError::Unsupported {
            field: "engram_head_dim".into(),
            reason: format!("{dim} is not a multiple of the Engram group {ENGRAM_GROUP}"),
        });
    }
    let bits = o.engram_bits;
    let row_bytes = dim * usize::from(bits) / 8 + dim / ENGRAM_GROUP * 2;
    for (t, &l) in cfg.engram_layer_ids.iter().enumerate() {
        let name = format!("layers.{l}.engram.embed.weight");
        let shape = ckpt.shape(&name)?;
        let (rows, cols) = rows_cols(&shape);
        if cols != dim {
            return Err(ConvertError::Tensor {
                tensor: name,
                reason: format!("shape {shape:?}, engram_head_dim is {dim}"),
            });
        }
        let file = format!("engram-L{l}.bin");
        let mut table = Out::create(out.join(&file))?;
        done.files.push(file);
        let last = t + 1 == cfg.engram_layer_ids.len();
        // The release row each container row takes (the defects move some).
        let source = |r: usize| match o.defect {
            Some(ConverterDefect::ShuffledEngram) if t == 0 => (r + 1) % rows,
            Some(ConverterDefect::SwappedEngramRows) if last && r < 2 => 1 - r,
            _ => r,
        };
        let moved = (0..rows.min(2)).any(|r| source(r) != r);
        let step = chunk_rows(cols);
        let mut buf = Vec::new();
        for first in (0..rows).step_by(step) {
            let n = step.min(rows - first);
            buf.resize(n * cols, 0.0);
            if moved {
                for j in 0..n {
                    ckpt.rows_f32(&name, source(first + j), &mut buf[j * cols..(j + 1) * cols])?;
                }
            } else {
                ckpt.rows_f32(&name, first, &mut buf)?;
            }
            let q = quantise_rows(&buf, cols, cols, ENGRAM_GROUP, bits).map_err(|(r, c)| {
                ConvertError::Tensor {
                    tensor: name.clone(),
                    reason: format!(
                        "row {} from column {c}: not finite or too large for an f16 scale",
                        first + r
                    ),
                }
            })?;
            let groups = cols / ENGRAM_GROUP;
            for j in 0..n {
                table.put(&pack_grouped(&q.ints[j * cols..(j + 1) * cols], bits))?;
                let s: Vec<u8> = q.scales[j * groups..(j + 1) * groups]
                    .iter()
                    .flat_map(|s| s.to_le_bytes())
                    .collect();
                table.put(&s)?;
            }
        }
        let bytes = table.finish()?;
        manifest.insert(
            l.to_string(),
            json!({"rows": rows, "dim": dim, "group": ENGRAM_GROUP, "bits": bits,
                   "row_bytes": row_bytes, "bytes": bytes}),
        );
        rows_all.push(rows as u64);
        done.engram_tables += 1;
    }

    let consts = ckpt.engram_constants()?;
    let mut map = TokenMap::FromCheckpoint.resolve(release, ckpt.engram_token_map()?, cfg)?;
    if map.len() != cfg.vocab_size {
        return Err(ConvertError::Unsupported {
            field: "Engram token map".into(),
            reason: format!(
                "{} entries; a container's engram-tokmap.bin holds exactly vocab_size = {}",
                map.len(),
                cfg.vocab_size
            ),
        });
    }
    let pad = usize::try_from(cfg.engram_pad_id)
        .ok()
        .and_then(|p| map.get(p).copied())
        .ok_or_else(|| ConvertError::Unsupported {
            field: "engram_pad_token_id".into(),
            reason: format!("{} is not a token of the map", cfg.engram_pad_id),
        })?;
    if o.defect == Some(ConverterDefect::ShiftedTokenMap) {
        // The last token trades compressed ids with the nearest token that has another one:
        // every compressed id stays in use, so only a comparison with the release sees it.
        let last = map.len() - 1;
        if let Some(j) = (0..last).rev().find(|&j| map[j] != map[last]) {
            map.swap(j, last);
        }
    }
    let layers: Vec<Value> = consts
        .layers
        .iter()
        .map(|h| json!({"layer": h.layer, "multipliers": h.multipliers, "primes": h.primes, "offsets": h.offsets}))
        .collect();
    let engram_json = json!({
        "compressed_vocab_size": consts.compressed_vocab_size,
        "pad_id": pad,
        "max_ngram_size": consts.max_ngram_size,
        "n_heads": consts.n_heads,
        "head_dim": dim,
        "layers": layers,
    });
    let path = out.join("engram.json");
    std::fs::write(
        &path,
        json_py::dumps_with(&engram_json, DumpOptions::file(1)),
    )
    .map_err(io(&path))?;
    done.files.push("engram.json".into());
    let path = out.join("engram-tokmap.bin");
    let bytes: Vec<u8> = map.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(&path, bytes).map_err(io(&path))?;
    done.files.push("engram-tokmap.bin".into());
    Ok((manifest, rows_all))
}
