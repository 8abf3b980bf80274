//! The release layout (MODEL.md §4.1, §4.5): `config.json` plus `model.safetensors` or
//! `model.safetensors.index.json` and its shards. Shards are memory-mapped; headers are parsed
//! and bounds-checked by the `safetensors` crate (contiguous, non-overlapping, in-range
//! offsets; a truncated shard is refused). Quantised weights pair with `<w>.scale`:
//! * `F8_E4M3` + `F8_E8M0 [ceil(out/32), ceil(in/32)]` → [`Storage::Fp8Block`];
//! * `F8_E4M3` + `F8_E8M0 [out, ceil(in/32)]` → [`Storage::Fp8Rows`] (Engram tables);
//! * `I8 [out, in/2]` + `F8_E8M0 [out, in/32]` → [`Storage::Fp4`]. An `I8` tensor without a
//!   scale is refused: a real int8 weight and packed FP4 would read identically.

use super::names::expected_tensors;
use super::{
    check_rows_request, rows_cols, tensor_err, Checkpoint, DenseDtype, Layout, QuantKind,
    QuantView, Storage, WeightView,
};
use crate::config::{read_json, Config, EngramHashConstants, EngramLayerHash, EngramPad};
use crate::dtype::{bf16_to_f32, e2m1_pair, e4m3_to_f32, e8m0_to_f32, f16_to_f32};
use crate::io::{map_file, present, read_file, MappedFile};
use crate::{Error, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Optional sidecar with the Engram hash constants (the format of
/// `upstream/engram/engram_hash_constants.json`).
pub const ENGRAM_SIDECAR: &str = "engram_hash_constants.json";
/// Optional token-map sidecars (token id → Engram compressed id).
pub const TOKMAP_BIN: &str = "engram-tokmap.bin";
pub const TOKMAP_NPY: &str = "engram_token_map_int32.npy";

struct Shard {
    path: PathBuf,
    map: MappedFile,
}

#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    /// Stored shape (packed bytes for FP4).
    stored_shape: Vec<usize>,
    /// Absolute byte range inside the shard's map.
    start: usize,
    end: usize,
    storage: Storage,
    /// Logical (dequantised) shape.
    shape: Vec<usize>,
    /// `<w>.scale` companion of a quantised weight.
    scale: Option<String>,
}

/// A release-layout checkpoint.
pub struct ReleaseCheckpoint {
    dir: PathBuf,
    config: Config,
    shards: Vec<Shard>,
    /// Looked up by name on every linear call: hashed (foldhash), not ordered.
    tensors: foldhash::HashMap<String, Entry>,
    engram_sidecar: Option<EngramHashConstants>,
}

fn fmt_err(file: &Path, offset: u64, reason: impl Into<String>) -> Error {
    Error::Format {
        file: file.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

/// `<stem>.weight` → `<stem>.scale`; other names have no companion.
fn scale_name(weight: &str) -> Option<String> {
    weight.strip_suffix(".weight").map(|s| format!("{s}.scale"))
}

impl ReleaseCheckpoint {
    /// Open `dir` (config.json + model.safetensors or the index and its shards).
    pub fn open(dir: &Path) -> Result<Self> {
        let config = Config::from_release_json(&dir.join("config.json"))?;
        let index = dir.join("model.safetensors.index.json");
        let files = if present(&index) {
            Some(read_index(dir, &index)?)
        } else {
            None
        };
        let shard_paths: Vec<PathBuf> = match &files {
            Some((paths, _)) => paths.clone(),
            None => vec![dir.join("model.safetensors")],
        };
        let mut ck = Self::from_files(dir, &shard_paths, config)?;
        if let Some((_, weight_map)) = files {
            ck.check_index(&index, &weight_map)?;
        }
        let sidecar = dir.join(ENGRAM_SIDECAR);
        if present(&sidecar) {
            ck.engram_sidecar = Some(read_engram_sidecar(&sidecar, &ck.config)?);
        }
        Ok(ck)
    }

    /// Open one or more safetensors files with a config from elsewhere (e.g. golden_tiny's
    /// `tiny_release.safetensors` with `Config::from_inference_json(meta.json)`).
    pub fn open_files(files: &[PathBuf], config: Config) -> Result<Self> {
        let dir = files
            .first()
            .and_then(|f| f.parent())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Self::from_files(&dir, files, config)
    }

    fn from_files(dir: &Path, files: &[PathBuf], config: Config) -> Result<Self> {
        config.validate()?;
        let mut shards = Vec::with_capacity(files.len());
        let mut raw: BTreeMap<String, Entry> = BTreeMap::new();
        for (si, path) in files.iter().enumerate() {
            let map = map_file(path)?;
            let (n, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| fmt_err(path, 0, format!("invalid safetensors header: {e}")))?;
            let data_start = 8 + n;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                let entry = Entry {
                    shard: si,
                    dtype: info.dtype,
                    stored_shape: info.shape.clone(),
                    start: data_start + s,
                    end: data_start + e,
                    storage: Storage::F32,
                    shape: info.shape.clone(),
                    scale: None,
                };
                if raw.insert(name.clone(), entry).is_some() {
                    return Err(tensor_err(
                        path,
                        &name,
                        "tensor appears in more than one shard",
                    ));
                }
            }
            shards.push(Shard {
                path: path.clone(),
                map,
            });
        }
        let tensors = classify(&shards, raw)?.into_iter().collect();
        let ck = ReleaseCheckpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            tensors,
            engram_sidecar: None,
        };
        if ck.tensors.values().any(|e| {
            matches!(
                e.storage,
                Storage::Fp8Block | Storage::Fp8Rows | Storage::Fp4
            )
        }) {
            ck.config.validate_upstream_kernels()?;
        }
        ck.check_expected()?;
        Ok(ck)
    }

    /// The directory the checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.tensors
            .get(name)
            .ok_or_else(|| tensor_err(&self.dir, name, "no such tensor in this checkpoint"))
    }

    fn path_of(&self, e: &Entry) -> &Path {
        &self.shards[e.shard].path
    }

    fn bytes(&self, e: &Entry) -> &[u8] {
        &self.shards[e.shard].map[e.start..e.end]
    }

    /// Every tensor the config implies is present, with its logical shape and an allowed
    /// storage (MODEL.md §4.2–§4.4).
    fn check_expected(&self) -> Result<()> {
        for t in expected_tensors(&self.config) {
            let Some(e) = self.tensors.get(&t.name) else {
                let file = self
                    .shards
                    .first()
                    .map(|s| s.path.as_path())
                    .unwrap_or(&self.dir);
                return Err(tensor_err(file, &t.name, "required tensor is missing"));
            };
            if e.shape != t.shape {
                return Err(tensor_err(
                    self.path_of(e),
                    &t.name,
                    format!("shape {:?}, the config implies {:?}", e.shape, t.shape),
                ));
            }
            if !t.class.allowed(Layout::Release).contains(&e.storage) {
                return Err(tensor_err(
                    self.path_of(e),
                    &t.name,
                    format!(
                        "stored as {:?} ({}), expected one of {:?}",
                        e.storage,
                        e.dtype,
                        t.class.allowed(Layout::Release)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every name of the index is in the shard the index names, and vice versa.
    fn check_index(&self, index: &Path, weight_map: &BTreeMap<String, PathBuf>) -> Result<()> {
        for (name, file) in weight_map {
            match self.tensors.get(name) {
                Some(e) if &self.shards[e.shard].path == file => {}
                Some(e) => {
                    return Err(tensor_err(
                        index,
                        name,
                        format!(
                            "index names {} but the tensor is in {}",
                            file.display(),
                            self.path_of(e).display()
                        ),
                    ))
                }
                None => {
                    return Err(tensor_err(
                        index,
                        name,
                        format!(
                            "index names {} but that shard does not hold it",
                            file.display()
                        ),
                    ))
                }
            }
        }
        if let Some((name, e)) = self
            .tensors
            .iter()
            .find(|(n, _)| !weight_map.contains_key(*n))
        {
            return Err(tensor_err(
                self.path_of(e),
                name,
                "tensor is not listed in model.safetensors.index.json",
            ));
        }
        Ok(())
    }

    fn decode_rows(&self, name: &str, e: &Entry, first: usize, out: &mut [f32]) -> Result<()> {
        let n = check_rows_request(self.path_of(e), name, &e.shape, first, out.len())?;
        let (_, cols) = rows_cols(&e.shape);
        let bytes = self.bytes(e);
        match e.storage {
            Storage::F32 => {
                let src = &bytes[first * cols * 4..(first + n) * cols * 4];
                for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Storage::Bf16 | Storage::F16 => {
                let src = &bytes[first * cols * 2..(first + n) * cols * 2];
                let f = if e.storage == Storage::Bf16 {
                    bf16_to_f32
                } else {
                    f16_to_f32
                };
                for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = f(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            Storage::E8m0 => {
                for (o, &b) in out.iter_mut().zip(&bytes[first * cols..(first + n) * cols]) {
                    *o = e8m0_to_f32(b);
                }
            }
            Storage::Fp8Block | Storage::Fp8Rows | Storage::Fp4 => {
                let v = self.view(name, e)?;
                dequant_rows(&v, first, out);
            }
            other => {
                return Err(tensor_err(
                    self.path_of(e),
                    name,
                    format!("storage {other:?} is not a release storage"),
                ))
            }
        }
        Ok(())
    }

    fn view<'a>(&'a self, name: &str, e: &'a Entry) -> Result<QuantView<'a>> {
        let kind = match e.storage {
            Storage::Fp8Block => QuantKind::Fp8Block,
            Storage::Fp8Rows => QuantKind::Fp8Rows,
            Storage::Fp4 => QuantKind::Fp4,
            _ => return Err(tensor_err(self.path_of(e), name, "not a quantised tensor")),
        };
        let scale_name = e.scale.as_deref().unwrap_or_default();
        let s = self.entry(scale_name)?;
        Ok(QuantView {
            kind,
            rows: e.shape[0],
            cols: e.shape[1],
            codes: self.bytes(e),
            scales: self.bytes(s),
            scale_cols: s.stored_shape[1],
        })
    }
}

/// Dequantise rows `[first, first + out.len()/cols)` of a quantised view, exactly.
pub(crate) fn dequant_rows(v: &QuantView<'_>, first: usize, out: &mut [f32]) {
    let cols = v.cols;
    for (i, row) in out.chunks_exact_mut(cols).enumerate() {
        let r = first + i;
        let sr = match v.kind {
            QuantKind::Fp8Block => r / 32,
            _ => r,
        };
        let scales = &v.scales[sr * v.scale_cols..(sr + 1) * v.scale_cols];
        match v.kind {
            QuantKind::Fp8Block | QuantKind::Fp8Rows => {
                let codes = &v.codes[r * cols..(r + 1) * cols];
                for ((o, c), blk) in row.chunks_mut(32).zip(codes.chunks(32)).zip(scales) {
                    let s = e8m0_to_f32(*blk);
                    for (o, &c) in o.iter_mut().zip(c) {
                        *o = e4m3_to_f32(c) * s;
                    }
                }
            }
            QuantKind::Fp4 => {
                let codes = &v.codes[r * cols / 2..(r + 1) * cols / 2];
                for ((o, c), blk) in row.chunks_mut(32).zip(codes.chunks(16)).zip(scales) {
                    let s = e8m0_to_f32(*blk);
                    for (pair, &b) in o.chunks_exact_mut(2).zip(c) {
                        let [lo, hi] = e2m1_pair(b);
                        pair[0] = lo * s;
                        pair[1] = hi * s;
                    }
                }
            }
        }
    }
}

/// Pair weights with their scales and fix storage + logical shape of every tensor.
fn classify(shards: &[Shard], mut raw: BTreeMap<String, Entry>) -> Result<BTreeMap<String, Entry>> {
    let names: Vec<String> = raw.keys().cloned().collect();
    for name in &names {
        let e = &raw[name];
        let path = &shards[e.shard].path;
        let storage = match e.dtype {
            Dtype::F32 => Some(Storage::F32),
            Dtype::BF16 => Some(Storage::Bf16),
            Dtype::F16 => Some(Storage::F16),
            Dtype::F8_E8M0 => {
                // A scale must belong to a quantised weight; name the weight when it is not.
                let Some(owner) = name.strip_suffix(".scale").map(|s| format!("{s}.weight")) else {
                    return Err(tensor_err(path, name, "F8_E8M0 tensor that is not a `<w>.scale` companion"));
                };
                match raw.get(&owner) {
                    None => {
                        return Err(tensor_err(path, &owner, format!("is missing, but its scale `{name}` is present")));
                    }
                    Some(w) if !matches!(w.dtype, Dtype::F8_E4M3 | Dtype::I8) => {
                        return Err(tensor_err(
                            &shards[w.shard].path,
                            &owner,
                            format!("dtype {} cannot carry the E8M0 scale `{name}` (expected F8_E4M3 or I8-packed FP4)", w.dtype),
                        ));
                    }
                    Some(_) => {}
                }
                Some(Storage::E8m0)
            }
            Dtype::F8_E4M3 | Dtype::I8 => None,
            other => {
                return Err(tensor_err(path, name, format!("unsupported dtype {other} (DS41 uses F32, BF16, F16, F8_E4M3, F8_E8M0 and I8-packed FP4)")))
            }
        };
        if let Some(s) = storage {
            raw.get_mut(name).expect("name from keys").storage = s;
            continue;
        }
        let (storage, shape, sname) = pair_quantised(shards, &raw, name)?;
        let e = raw.get_mut(name).expect("name from keys");
        e.storage = storage;
        e.shape = shape;
        e.scale = Some(sname);
    }
    Ok(raw)
}

fn pair_quantised(
    shards: &[Shard],
    raw: &BTreeMap<String, Entry>,
    name: &str,
) -> Result<(Storage, Vec<usize>, String)> {
    let e = &raw[name];
    let path = &shards[e.shard].path;
    let is_fp4 = e.dtype == Dtype::I8;
    let Some(sname) = scale_name(name).filter(|s| raw.contains_key(s)) else {
        return Err(tensor_err(
            path,
            name,
            if is_fp4 {
                "I8 tensor without a `.scale` companion is refused: a real int8 weight and packed FP4 read identically"
            } else {
                "F8_E4M3 tensor without a `.scale` companion"
            },
        ));
    };
    let s = &raw[&sname];
    if s.dtype != Dtype::F8_E8M0 {
        return Err(tensor_err(
            &shards[s.shard].path,
            &sname,
            format!("scale dtype is {}, expected F8_E8M0", s.dtype),
        ));
    }
    let [rows, stored_cols] = e.stored_shape[..] else {
        return Err(tensor_err(
            path,
            name,
            format!(
                "quantised weight must be 2-D, shape is {:?}",
                e.stored_shape
            ),
        ));
    };
    let cols = if is_fp4 { stored_cols * 2 } else { stored_cols };
    let sc = cols.div_ceil(32);
    let got = s.stored_shape.clone();
    let (storage, want) = if is_fp4 {
        (Storage::Fp4, vec![rows, sc])
    } else if got == [rows.div_ceil(32), sc] {
        (Storage::Fp8Block, got.clone())
    } else {
        (Storage::Fp8Rows, vec![rows, sc])
    };
    if got != want {
        let expect = if is_fp4 {
            format!("[{rows}, {sc}] (per row, per 32 columns)")
        } else {
            format!(
                "[{}, {sc}] (32x32 blocks) or [{rows}, {sc}] (per row, per 32)",
                rows.div_ceil(32)
            )
        };
        return Err(tensor_err(
            path,
            name,
            format!(
                "stored shape {:?} does not fit its scale `{sname}` {got:?}: the scale should be {expect}",
                e.stored_shape
            ),
        ));
    }
    Ok((storage, vec![rows, cols], sname))
}

/// `model.safetensors.index.json` → (distinct shard paths in order, name → shard path).
fn read_index(dir: &Path, index: &Path) -> Result<(Vec<PathBuf>, BTreeMap<String, PathBuf>)> {
    let v = read_json(index)?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| fmt_err(index, 0, "missing object `weight_map`"))?;
    let mut files = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (name, file) in map {
        let f = file.as_str().ok_or_else(|| {
            tensor_err(
                index,
                name,
                format!("shard name must be a string, got {file}"),
            )
        })?;
        let rel = Path::new(f);
        if f.is_empty()
            || rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(tensor_err(
                index,
                name,
                format!("shard name {f:?} must be a plain relative file name"),
            ));
        }
        let path = dir.join(rel);
        if !files.contains(&path) {
            if !present(&path) {
                return Err(tensor_err(
                    index,
                    name,
                    format!("index names shard {f:?}, which does not exist"),
                ));
            }
            files.push(path.clone());
        }
        weight_map.insert(name.clone(), path);
    }
    if files.is_empty() {
        return Err(fmt_err(index, 0, "`weight_map` is empty"));
    }
    Ok((files, weight_map))
}

/// Read `engram_hash_constants.json` and check it against the config.
fn read_engram_sidecar(path: &Path, cfg: &Config) -> Result<EngramHashConstants> {
    let v = read_json(path)?;
    let bad = |field: &str, rule: &str| Error::Config {
        field: format!("{ENGRAM_SIDECAR}.{field}"),
        rule: format!("{rule} (in {})", path.display()),
    };
    let ids: Vec<usize> = serde_json::from_value(v.get("layer_ids").cloned().unwrap_or_default())
        .map_err(|_| bad("layer_ids", "expected a list of layer ids"))?;
    let primes: Vec<Vec<Vec<u64>>> =
        serde_json::from_value(v.get("primes").cloned().unwrap_or_default())
            .map_err(|_| bad("primes", "expected [layer][n-2][head] integers"))?;
    let offsets: Vec<Vec<u64>> =
        serde_json::from_value(v.get("offsets").cloned().unwrap_or_default())
            .map_err(|_| bad("offsets", "expected [layer][column] integers"))?;
    let mults: Vec<Vec<i64>> =
        serde_json::from_value(v.get("multipliers").cloned().unwrap_or_default())
            .map_err(|_| bad("multipliers", "expected [layer][shift] integers"))?;
    if primes.len() != ids.len() || offsets.len() != ids.len() || mults.len() != ids.len() {
        return Err(bad(
            "layer_ids",
            "primes, offsets and multipliers need one entry per layer id",
        ));
    }
    let k = EngramHashConstants {
        max_ngram_size: v
            .get("max_ngram_size")
            .and_then(|x| x.as_u64())
            .unwrap_or(0) as usize,
        n_heads: v.get("n_heads").and_then(|x| x.as_u64()).unwrap_or(0) as usize,
        compressed_vocab_size: v
            .get("compressed_vocab_size")
            .and_then(|x| x.as_u64())
            .unwrap_or(cfg.engram_compressed_vocab_size as u64)
            as usize,
        pad: EngramPad::RawToken(cfg.engram_pad_id),
        layers: ids
            .into_iter()
            .zip(primes)
            .zip(offsets)
            .zip(mults)
            .map(
                |(((layer, primes), offsets), multipliers)| EngramLayerHash {
                    layer,
                    multipliers,
                    primes,
                    offsets,
                },
            )
            .collect(),
    };
    k.check_against(cfg, ENGRAM_SIDECAR)
        .map_err(|e| crate::config::in_file_err(path, e))?;
    Ok(k)
}

impl Checkpoint for ReleaseCheckpoint {
    fn layout(&self) -> Layout {
        Layout::Release
    }
    fn config(&self) -> &Config {
        &self.config
    }
    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort_unstable();
        names
    }
    fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.entry(name)?.shape.clone())
    }
    fn storage(&self, name: &str) -> Result<Storage> {
        Ok(self.entry(name)?.storage)
    }
    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let e = self.entry(name)?;
        let mut out = vec![0.0; e.shape.iter().product()];
        if !out.is_empty() {
            self.decode_rows(name, e, 0, &mut out)?;
        }
        Ok(out)
    }
    fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> Result<()> {
        let e = self.entry(name)?;
        self.decode_rows(name, e, first, out)
    }
    fn stored_bytes(&self, name: &str) -> Result<Option<u64>> {
        let e = self.entry(name)?;
        Ok(Some((e.end - e.start) as u64))
    }
    fn weight_view(&self, name: &str) -> Result<Option<WeightView<'_>>> {
        let e = self.entry(name)?;
        let dtype = match e.storage {
            Storage::Fp8Block | Storage::Fp8Rows | Storage::Fp4 => {
                return Ok(Some(WeightView::Quant(self.view(name, e)?)))
            }
            Storage::F32 => DenseDtype::F32,
            Storage::Bf16 => DenseDtype::Bf16,
            Storage::F16 => DenseDtype::F16,
            _ => return Ok(None),
        };
        let [rows, cols] = e.shape[..] else {
            return Ok(None);
        };
        Ok(Some(WeightView::Dense {
            dtype,
            rows,
            cols,
            bytes: self.bytes(e),
        }))
    }
    fn quant_view(&self, name: &str) -> Result<Option<QuantView<'_>>> {
        let e = self.entry(name)?;
        match e.storage {
            Storage::Fp8Block | Storage::Fp8Rows | Storage::Fp4 => Ok(Some(self.view(name, e)?)),
            _ => Ok(None),
        }
    }
    fn engram_constants(&self) -> Result<EngramHashConstants> {
        let computed = EngramHashConstants::for_release(&self.config);
        match (&self.engram_sidecar, computed) {
            (Some(side), Ok(c)) if side.layers != c.layers => Err(Error::Config {
                field: ENGRAM_SIDECAR.into(),
                rule: format!(
                    "disagrees with the release recipe (numpy default_rng(10007·layer_id) \
                     multipliers, primes above engram_vocab_size − 1) in {}",
                    self.dir.display()
                ),
            }),
            (Some(side), _) => Ok(side.clone()),
            (None, c) => c,
        }
    }
    /// A sidecar map next to the weights, if present: `engram-tokmap.bin` (raw little-endian
    /// int32, the container's format) or `engram_token_map_int32.npy` (the upstream file).
    /// Otherwise `None`: the map is built from the tokenizer (MODEL.md §6.6.1).
    fn verify_unchanged(&self) -> Result<()> {
        self.shards.iter().try_for_each(|s| s.map.check_unchanged())
    }
    fn engram_token_map(&self) -> Result<Option<Vec<i32>>> {
        let bin = self.dir.join(TOKMAP_BIN);
        let npy = self.dir.join(TOKMAP_NPY);
        // One int32 per token id (plus, for .npy, a header of at most 64 KiB).
        let entries = 4 * self.config.vocab_size as u64;
        let (path, map) = if present(&bin) {
            let b = read_file(&bin, entries, "token map of vocab_size int32 entries")?;
            (bin, raw_i32(&b))
        } else if present(&npy) {
            let b = read_file(&npy, entries + (64 << 10), "token map .npy")?;
            let m = npy_i32_vector(&npy, &b)?;
            (npy, m)
        } else {
            return Ok(None);
        };
        check_token_map(&path, &map, &self.config)?;
        Ok(Some(map))
    }
}

fn raw_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A 1-D little-endian int32 `.npy` array (format versions 1–3).
pub fn npy_i32_vector(path: &Path, b: &[u8]) -> Result<Vec<i32>> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(fmt_err(
            path,
            0,
            "not a .npy file (magic \\x93NUMPY missing)",
        ));
    }
    let (hlen, start): (usize, usize) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(fmt_err(path, 6, format!("unsupported .npy version {v}"))),
    };
    let header = b
        .get(start..start.saturating_add(hlen))
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| fmt_err(path, start as u64, "truncated or non-UTF-8 .npy header"))?;
    let compact: String = header.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains("'descr':'<i4'") || !compact.contains("'fortran_order':False") {
        return Err(fmt_err(
            path,
            start as u64,
            format!("expected a little-endian int32 C-order array, header is {header:?}"),
        ));
    }
    let shape = compact
        .split("'shape':(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| fmt_err(path, start as u64, "no shape in the .npy header"))?;
    let dims: Vec<&str> = shape.split(',').filter(|d| !d.is_empty()).collect();
    let n: usize = match dims[..] {
        [d] => d
            .parse()
            .map_err(|_| fmt_err(path, start as u64, format!("bad shape ({shape})")))?,
        _ => {
            return Err(fmt_err(
                path,
                start as u64,
                format!("expected a 1-D array, shape is ({shape})"),
            ))
        }
    };
    let data = &b[start + hlen..];
    if Some(data.len()) != n.checked_mul(4) {
        return Err(fmt_err(
            path,
            (start + hlen) as u64,
            format!("{} data bytes for {n} int32 values", data.len()),
        ));
    }
    Ok(raw_i32(data))
}

/// A token map must cover the vocabulary and stay inside the compressed ids.
pub(crate) fn check_token_map(path: &Path, map: &[i32], cfg: &Config) -> Result<()> {
    if map.len() != cfg.vocab_size {
        return Err(fmt_err(
            path,
            0,
            format!(
                "{} entries, expected vocab_size = {}",
                map.len(),
                cfg.vocab_size
            ),
        ));
    }
    if let Some((t, &id)) = map
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id as usize >= cfg.engram_compressed_vocab_size)
    {
        return Err(fmt_err(
            path,
            (4 * t) as u64,
            format!(
                "token {t} maps to {id}, outside 0..{}",
                cfg.engram_compressed_vocab_size
            ),
        ));
    }
    // MODEL.md §2.2 item 6: ids are handed out densely, so every compressed id occurs.
    let mut seen = vec![false; cfg.engram_compressed_vocab_size];
    map.iter().for_each(|&id| seen[id as usize] = true);
    if let Some(missing) = seen.iter().position(|&s| !s) {
        return Err(fmt_err(path, 0, format!("compressed id {missing} never occurs: the map must use exactly engram_compressed_vocab_size = {} ids", cfg.engram_compressed_vocab_size)));
    }
    Ok(())
}
