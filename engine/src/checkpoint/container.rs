//! The WASTE v0 container (CONTAINER.md §1–§9): `manifest.json`, `trunk.bin` (F32 / Q8G /
//! Q4G / Q3G entries with f16 group scales after the rows), `experts-L{n}.bin` banks of 4 KiB-
//! aligned VQ3R (1–8 stages of byte indices; VQ2R: two) or VQ4P records with 48-byte `WEXP`
//! headers, `codebooks.bin` (`WCBK`), `engram-L{n}.bin` rows, `engram.json`,
//! `engram-tokmap.bin` and `specials.json`. Q3G, VQ2R and the stage counts beyond CONTAINER.md's
//! are what WASTE's `convert.py` (8d5405d8) writes with `--trunk-bits 3` and `--stages N`.
//!
//! Opening validates the manifest, every trunk entry's byte ranges, every bank record header
//! and every codebook header, and cross-checks the Engram statements (config, `engram.json`,
//! manifest rows). Weights stay memory-mapped: a trunk row range, one expert matrix or a few
//! Engram rows are decoded when asked for. Decoding follows the WASTE oracle (§4.2, §11): f16
//! scales and codebook entries widened to f32; a VQ weight is `scale · Σ_s codebook_s[idx_s]`
//! with the stage sum in stage order.

use super::names::{
    container_to_release, expected_tensors, expert_name, release_to_container, ContainerName,
};
use super::{
    book_entries, check_rows_request, rows_cols, tensor_err, vq_indices, vq_vector, Checkpoint,
    DenseDtype, Layout, QuantView, Storage, VqView, WeightView, MAX_VQ_STAGES, VQ_ROW_BAND,
    VQ_WIDTH,
};
use crate::config::{
    parse_json_bytes, read_json, Config, EngramHashConstants, EngramLayerHash, EngramPad,
};
use crate::dtype::f16_to_f32;
use crate::io::{map_file, present, read_file, MappedFile};
use crate::{Error, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `WEXP` little-endian.
pub const WEXP_MAGIC: u32 = 0x5058_4557;
/// `WCBK` little-endian.
pub const WCBK_MAGIC: u32 = 0x4B42_4357;
pub const WEXP_HEADER_BYTES: usize = 48;
pub const RECORD_ALIGN: usize = 4096;

/// Options for opening a container.
#[derive(Debug, Clone, Copy, Default)]
pub struct ContainerOptions {
    /// Verify every expert record's CRC-32 when it is decoded (WASTE's `WASTE_VERIFY=1`).
    pub verify_crc: bool,
}

/// The VQ3R format code (CONTAINER.md §4.1), also what every codebook header carries.
const VQ3R_CODEBOOK_FMT: u8 = 4;
/// WASTE's `WQ_VQ2R` (`src/waste_format.h`).
const VQ2R_FMT: u8 = 5;
/// WASTE's `WQ_VQ4P`.
const VQ4P_FMT: u8 = 8;

/// Vector-quantisation format of the expert records (`manifest.expert_quant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum VqFormat {
    /// `fmt` 4: one byte index per stage (WASTE's converter writes 2, 3, 4 or 6 stages of
    /// 16–256 entries under this name).
    Vq3r,
    /// The same coding with two stages, under its own name (`convert.py --stages 2`).
    Vq2r,
    /// `fmt` 8: four 6-bit indices packed into 3 bytes.
    Vq4p,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ExpertQuant {
    pub format: VqFormat,
    pub stages: usize,
    pub vec_dim: usize,
    pub entries: usize,
}

impl ExpertQuant {
    /// The `fmt` codes a `WEXP` record header or a `codebooks.bin` header may carry for this
    /// format. WASTE's writers (convert.py, make_test_container.py at 8d5405d8) put VQ3R's 4
    /// in every codebook header and in every byte-per-stage record (VQ2R's included), and its
    /// loader reads no codebook header field; the format's own code is accepted too, as
    /// `waste_format.h` describes the fields ("which WQ_* this codebook serves").
    fn fmt_codes(&self, record: bool) -> &'static [u8] {
        match (self.format, record) {
            (VqFormat::Vq3r, _) => &[VQ3R_CODEBOOK_FMT],
            (VqFormat::Vq2r, _) => &[VQ3R_CODEBOOK_FMT, VQ2R_FMT],
            (VqFormat::Vq4p, true) => &[VQ4P_FMT],
            (VqFormat::Vq4p, false) => &[VQ3R_CODEBOOK_FMT, VQ4P_FMT],
        }
    }
    fn storage(&self) -> Storage {
        match self.format {
            VqFormat::Vq3r => Storage::Vq3r,
            VqFormat::Vq2r => Storage::Vq2r,
            VqFormat::Vq4p => Storage::Vq4p,
        }
    }
    /// Index bytes per (row, vector).
    fn bytes_per_vector(&self) -> usize {
        match self.format {
            VqFormat::Vq3r | VqFormat::Vq2r => self.stages,
            VqFormat::Vq4p => 3,
        }
    }
}

/// The parsed 48-byte `WEXP` record header (CONTAINER.md §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WexpHeader {
    pub magic: u32,
    pub layer: u16,
    pub expert_id: u16,
    pub fmt: u8,
    pub flags: u8,
    pub codebook_id: u16,
    pub lowrank_id: u16,
    pub rec_4k_blocks: u32,
    /// gate, up, down index-block offsets.
    pub kind_off: [u32; 3],
    pub chan_corr_off: u32,
    pub crc32: u32,
}

impl WexpHeader {
    pub fn parse(b: &[u8; WEXP_HEADER_BYTES]) -> Self {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        WexpHeader {
            magic: u32_at(0),
            layer: u16_at(4),
            expert_id: u16_at(6),
            fmt: b[8],
            flags: b[9],
            codebook_id: u16_at(10),
            lowrank_id: u16_at(12),
            rec_4k_blocks: u32_at(16),
            kind_off: [u32_at(20), u32_at(24), u32_at(28)],
            chan_corr_off: u32_at(32),
            crc32: u32_at(36),
        }
    }
}

#[derive(Debug, Clone)]
struct TrunkEntry {
    container_name: String,
    storage: Storage,
    shape: Vec<usize>,
    off: usize,
    group: usize,
    scale_off: usize,
}

struct Bank {
    path: PathBuf,
    map: MappedFile,
    experts: usize,
    record_size: usize,
    codebook_base: usize,
    /// Byte length of the CRC-covered payload (48 .. end of scales) per record.
    payload_end: usize,
    headers: Vec<WexpHeader>,
}

struct EngramTable {
    path: PathBuf,
    map: MappedFile,
    rows: usize,
    dim: usize,
    group: usize,
    bits: usize,
    row_bytes: usize,
}

/// One entry of `specials.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Special {
    pub id: u32,
    pub text: String,
}

/// A WASTE v0 container.
pub struct ContainerCheckpoint {
    dir: PathBuf,
    config: Config,
    options: ContainerOptions,
    tensor_prefix: String,
    trunk_path: PathBuf,
    trunk: MappedFile,
    /// Looked up by name on every linear call: hashed (foldhash), not ordered.
    trunk_entries: foldhash::HashMap<String, TrunkEntry>,
    quant: ExpertQuant,
    banks: BTreeMap<usize, Bank>,
    /// Codebook id → `entries × vec_dim` f32 (widened f16).
    codebooks: Vec<Vec<f32>>,
    engram_tables: BTreeMap<usize, EngramTable>,
    engram: Option<EngramHashConstants>,
    tokmap: Option<Vec<i32>>,
    specials: Vec<Special>,
}

fn fmt_err(file: &Path, offset: u64, reason: impl Into<String>) -> Error {
    Error::Format {
        file: file.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

/// `name` must be a plain file name inside the container.
fn plain_file(manifest: &Path, field: &str, name: &str) -> Result<()> {
    let p = Path::new(name);
    let ok = !name.is_empty()
        && p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(fmt_err(
            manifest,
            0,
            format!("`{field}` = {name:?} must be a plain file name"),
        ))
    }
}

/// Small typed accessors over manifest JSON with the key path in errors.
struct J<'a> {
    file: &'a Path,
}

impl J<'_> {
    fn err(&self, field: &str, rule: impl Into<String>) -> Error {
        fmt_err(self.file, 0, format!("`{field}`: {}", rule.into()))
    }
    fn get<'v>(&self, v: &'v Value, field: &str, key: &str) -> Result<&'v Value> {
        v.get(key)
            .filter(|x| !x.is_null())
            .ok_or_else(|| self.err(&format!("{field}.{key}"), "required key is missing"))
    }
    fn usize(&self, v: &Value, field: &str, key: &str) -> Result<usize> {
        let x = self.get(v, field, key)?;
        x.as_u64()
            .and_then(|u| usize::try_from(u).ok())
            .ok_or_else(|| {
                self.err(
                    &format!("{field}.{key}"),
                    format!("expected a non-negative integer, got {x}"),
                )
            })
    }
    fn str<'v>(&self, v: &'v Value, field: &str, key: &str) -> Result<&'v str> {
        let x = self.get(v, field, key)?;
        x.as_str().ok_or_else(|| {
            self.err(
                &format!("{field}.{key}"),
                format!("expected a string, got {x}"),
            )
        })
    }
    fn obj<'v>(
        &self,
        v: &'v Value,
        field: &str,
        key: &str,
    ) -> Result<&'v serde_json::Map<String, Value>> {
        let x = self.get(v, field, key)?;
        x.as_object().ok_or_else(|| {
            self.err(
                &format!("{field}.{key}"),
                format!("expected an object, got {x}"),
            )
        })
    }
    fn shape(&self, v: &Value, field: &str) -> Result<Vec<usize>> {
        let x = self.get(v, field, "shape")?;
        let arr = x
            .as_array()
            .ok_or_else(|| self.err(&format!("{field}.shape"), "expected a list"))?;
        let dims: Option<Vec<usize>> = arr
            .iter()
            .map(|d| d.as_u64().and_then(|u| usize::try_from(u).ok()))
            .collect();
        let dims = dims.ok_or_else(|| {
            self.err(
                &format!("{field}.shape"),
                format!("expected non-negative integers, got {x}"),
            )
        })?;
        if dims.is_empty()
            || dims.contains(&0)
            || dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_none()
        {
            return Err(self.err(
                &format!("{field}.shape"),
                format!("{dims:?} is not a valid non-empty shape"),
            ));
        }
        Ok(dims)
    }
}

/// Decode a layer key of a manifest map (`"12"`).
fn layer_key(file: &Path, field: &str, k: &str) -> Result<usize> {
    k.parse::<usize>()
        .ok()
        .filter(|l| l.to_string() == k)
        .ok_or_else(|| fmt_err(file, 0, format!("`{field}`: key {k:?} is not a layer id")))
}

impl ContainerCheckpoint {
    /// Open with default options (CRC not verified on reads).
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, ContainerOptions::default())
    }

    pub fn open_with(dir: &Path, options: ContainerOptions) -> Result<Self> {
        let manifest_path = dir.join("manifest.json");
        let manifest = read_json(&manifest_path)?;
        let j = J {
            file: &manifest_path,
        };
        match manifest.get("format_version") {
            Some(v) if v.as_u64() == Some(0) => {}
            Some(v) => {
                return Err(j.err(
                    "format_version",
                    format!("must be 0, got {v}: not a WASTE v0 container"),
                ))
            }
            None => {
                return Err(j.err(
                    "format_version",
                    "required key is missing: not a WASTE v0 container",
                ))
            }
        }
        let tensor_prefix = j.str(&manifest, "", "tensor_prefix")?.to_string();
        let config_v = j.get(&manifest, "", "config")?;
        let mut config = Config::from_container_config(config_v)
            .map_err(|e| crate::config::in_file_err(&manifest_path, e))?;
        let quant = parse_expert_quant(&j, &manifest)?;
        add_vision_json(dir, &mut config)?;

        // Engram statements first: they fix the pad and are cross-checked below.
        let engram = if config.engram_layer_ids.is_empty() {
            None
        } else {
            Some(read_engram_json(
                &engram_side_file(dir, "engram.json", &config)?,
                &mut config,
            )?)
        };

        let trunk_path = dir.join("trunk.bin");
        let trunk = map_file(&trunk_path)?;
        let trunk_entries = parse_trunk(&j, &manifest, &tensor_prefix, &trunk_path, trunk.len())?
            .into_iter()
            .collect();
        let codebooks = read_codebooks(&dir.join("codebooks.bin"), &quant)?;
        let banks = open_banks(dir, &j, &manifest, &config, &quant, codebooks.len())?;
        let engram_tables = open_engram_tables(dir, &j, &manifest, &config)?;
        let tokmap = if engram.is_some() {
            Some(read_tokmap(
                &engram_side_file(dir, "engram-tokmap.bin", &config)?,
                &config,
            )?)
        } else {
            None
        };
        let specials_path = dir.join("specials.json");
        let specials = if present(&specials_path) {
            read_specials(&specials_path, &config)?
        } else {
            Vec::new()
        };
        let ck = ContainerCheckpoint {
            dir: dir.to_path_buf(),
            config,
            options,
            tensor_prefix,
            trunk_path,
            trunk,
            trunk_entries,
            quant,
            banks,
            codebooks,
            engram_tables,
            engram,
            tokmap,
            specials,
        };
        ck.check_expected()?;
        Ok(ck)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn tensor_prefix(&self) -> &str {
        &self.tensor_prefix
    }
    pub fn expert_quant(&self) -> ExpertQuant {
        self.quant
    }
    /// `specials.json` entries with every JSON escape decoded (empty when absent).
    pub fn specials(&self) -> &[Special] {
        &self.specials
    }
    /// The container name a canonical trunk tensor is stored under.
    pub fn container_name(&self, name: &str) -> Option<&str> {
        self.trunk_entries
            .get(name)
            .map(|e| e.container_name.as_str())
    }

    /// The validated header of record `expert` in layer `layer`'s bank.
    pub fn record_header(&self, layer: usize, expert: usize) -> Result<WexpHeader> {
        let bank = self.bank(layer)?;
        bank.headers.get(expert).copied().ok_or_else(|| {
            fmt_err(
                &bank.path,
                0,
                format!(
                    "expert {expert} is beyond the bank's {} records",
                    bank.experts
                ),
            )
        })
    }

    /// Check the CRC-32 of one record.
    pub fn verify_record_crc(&self, layer: usize, expert: usize) -> Result<()> {
        let bank = self.bank(layer)?;
        if expert >= bank.experts {
            return Err(fmt_err(
                &bank.path,
                0,
                format!(
                    "expert {expert} is beyond the bank's {} records",
                    bank.experts
                ),
            ));
        }
        let start = expert * bank.record_size;
        let payload = &bank.map[start + WEXP_HEADER_BYTES..start + bank.payload_end];
        let got = crc32fast::hash(payload);
        let want = bank.headers[expert].crc32;
        if got != want {
            return Err(fmt_err(
                &bank.path,
                (start + 36) as u64,
                format!("checksum mismatch for expert {expert} of layer {layer}: header says {want:#010x}, payload has {got:#010x}"),
            ));
        }
        Ok(())
    }

    /// Verify the CRC of every record of every bank; returns the number of records checked.
    pub fn verify_all_crc(&self) -> Result<usize> {
        let mut n = 0;
        for (&l, b) in &self.banks {
            for e in 0..b.experts {
                self.verify_record_crc(l, e)?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn bank(&self, layer: usize) -> Result<&Bank> {
        self.banks.get(&layer).ok_or_else(|| {
            fmt_err(
                &self.dir.join("manifest.json"),
                0,
                format!("no expert bank for layer {layer}"),
            )
        })
    }

    /// (M, N) of expert kind κ: gate/up `I × Hd`, down `Hd × I`.
    fn kind_shape(&self, kind: usize) -> (usize, usize) {
        let (i, d) = (self.config.moe_inter_dim, self.config.dim);
        if kind == 2 {
            (d, i)
        } else {
            (i, d)
        }
    }

    fn check_expected(&self) -> Result<()> {
        let manifest = self.dir.join("manifest.json");
        for t in expected_tensors(&self.config) {
            let (storage, shape) = match release_to_container(&t.name) {
                ContainerName::Trunk(cname) => match self.trunk_entries.get(&t.name) {
                    Some(e) => (e.storage, e.shape.clone()),
                    None => {
                        return Err(tensor_err(
                            &manifest,
                            &t.name,
                            format!(
                                "required tensor is missing (container name `{}{cname}`)",
                                self.tensor_prefix
                            ),
                        ))
                    }
                },
                ContainerName::Expert {
                    layer,
                    expert,
                    kind,
                } => {
                    let bank = self.bank(layer).map_err(|_| tensor_err(&manifest, &t.name, format!("required tensor is missing (no bank experts-L{layer}.bin in the manifest)")))?;
                    if expert >= bank.experts {
                        return Err(tensor_err(
                            &bank.path,
                            &t.name,
                            format!(
                                "required tensor is missing (bank has {} records)",
                                bank.experts
                            ),
                        ));
                    }
                    let (m, n) = self.kind_shape(kind);
                    (self.quant.storage(), vec![m, n])
                }
                ContainerName::EngramTable { layer } => match self.engram_tables.get(&layer) {
                    Some(tb) => (Storage::EngramRows, vec![tb.rows, tb.dim]),
                    None => {
                        return Err(tensor_err(
                            &manifest,
                            &t.name,
                            format!(
                            "required tensor is missing (no engram-L{layer}.bin in the manifest)"
                        ),
                        ))
                    }
                },
                ContainerName::NotStored => {
                    return Err(tensor_err(
                        &manifest,
                        &t.name,
                        "has no place in a container",
                    ))
                }
            };
            if shape != t.shape {
                return Err(tensor_err(
                    &manifest,
                    &t.name,
                    format!("shape {shape:?}, the config implies {:?}", t.shape),
                ));
            }
            if !t.class.allowed(Layout::Container).contains(&storage) {
                return Err(tensor_err(
                    &manifest,
                    &t.name,
                    format!(
                        "stored as {storage:?}, expected one of {:?}",
                        t.class.allowed(Layout::Container)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn trunk_rows(&self, name: &str, e: &TrunkEntry, first: usize, out: &mut [f32]) -> Result<()> {
        let n = check_rows_request(&self.trunk_path, name, &e.shape, first, out.len())?;
        let (_, cols) = rows_cols(&e.shape);
        let t = &self.trunk[..];
        match e.storage {
            Storage::F32 => {
                let src = &t[e.off + first * cols * 4..e.off + (first + n) * cols * 4];
                for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Storage::Q8G | Storage::Q4G | Storage::Q3G => {
                let groups = cols.div_ceil(e.group);
                let row_bytes = grouped_row_bytes(e.storage, groups * e.group);
                for (i, row) in out.chunks_exact_mut(cols).enumerate() {
                    let r = first + i;
                    let data = &t[e.off + r * row_bytes..e.off + (r + 1) * row_bytes];
                    let sc = &t[e.scale_off + r * groups * 2..e.scale_off + (r + 1) * groups * 2];
                    for (c, o) in row.iter_mut().enumerate() {
                        let g = c / e.group;
                        let s = f16_to_f32(u16::from_le_bytes([sc[2 * g], sc[2 * g + 1]]));
                        let q = match e.storage {
                            Storage::Q8G => data[c] as i8 as i32,
                            Storage::Q4G => {
                                let b = data[c / 2];
                                (if c % 2 == 0 { b & 0xF } else { b >> 4 }) as i32 - 8
                            }
                            _ => {
                                // Three bits LSB-first at bit 3c; the guard byte ending every
                                // row keeps the two-byte read inside it.
                                let (byte, shift) = (3 * c / 8, 3 * c % 8);
                                let two = u16::from_le_bytes([data[byte], data[byte + 1]]);
                                i32::from((two >> shift) & 7) - 4
                            }
                        };
                        *o = q as f32 * s;
                    }
                }
            }
            other => {
                return Err(tensor_err(
                    &self.trunk_path,
                    name,
                    format!("storage {other:?} is not a trunk storage"),
                ))
            }
        }
        Ok(())
    }

    /// Decode rows `[first, first + out.len()/N)` of kind κ of one expert record.
    fn expert_rows(
        &self,
        name: &str,
        layer: usize,
        expert: usize,
        kind: usize,
        first: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let (m, ncols) = self.kind_shape(kind);
        let bank = self.bank(layer)?;
        check_rows_request(&bank.path, name, &[m, ncols], first, out.len())?;
        if expert >= bank.experts {
            return Err(tensor_err(
                &bank.path,
                name,
                format!("bank has {} records", bank.experts),
            ));
        }
        if self.options.verify_crc {
            self.verify_record_crc(layer, expert)?;
        }
        let h = &bank.headers[expert];
        let rec = &bank.map[expert * bank.record_size..(expert + 1) * bank.record_size];
        let q = self.quant;
        let (vd, stages, bpv) = (q.vec_dim, q.stages, q.bytes_per_vector());
        let nvec = ncols / vd;
        let idx = &rec[h.kind_off[kind] as usize..];
        // per-row f16 scales: gate M, then up M, then down M
        let scale_base =
            h.chan_corr_off as usize + 2 * rows_before(kind, self.config.moe_inter_dim);
        let cb0 = bank.codebook_base + kind * stages;
        // This kind's codebooks, looked up once rather than once per weight.
        let books = &self.codebooks[cb0..cb0 + stages];
        for (i, row) in out.chunks_exact_mut(ncols).enumerate() {
            let r = first + i;
            let s = f16_to_f32(u16::from_le_bytes([
                rec[scale_base + 2 * r],
                rec[scale_base + 2 * r + 1],
            ]));
            for v in 0..nvec {
                let at = (((r / VQ_ROW_BAND) * nvec + v) * VQ_ROW_BAND + r % VQ_ROW_BAND) * bpv;
                let sel = vq_indices(&idx[at..at + bpv], q.format == VqFormat::Vq4p);
                if let Some(&bad) = sel[..stages].iter().find(|&&x| x >= q.entries) {
                    return Err(fmt_err(
                        &bank.path,
                        (expert * bank.record_size + h.kind_off[kind] as usize + at) as u64,
                        format!(
                            "expert {expert} of layer {layer}: index {bad} ≥ the codebooks' {} entries",
                            q.entries
                        ),
                    ));
                }
                let dst = &mut row[v * vd..(v + 1) * vd];
                if let Ok(dst) = <&mut [f32; VQ_WIDTH]>::try_from(&mut *dst) {
                    *dst = vq_vector(book_entries(books, sel), s);
                    continue;
                }
                for (t, o) in dst.iter_mut().enumerate() {
                    let mut acc = 0.0f32;
                    for (book, &ix) in books.iter().zip(&sel[..stages]) {
                        acc += book[ix * vd + t];
                    }
                    *o = s * acc;
                }
            }
        }
        Ok(())
    }

    /// The view of expert matrix κ of one record, when the kernels may read it directly:
    /// eight-wide vectors whose every index is valid by construction (VQ4P's six bits with at
    /// least 64 entries, VQ3R's bytes with 256), and no per-read CRC check asked for.
    fn expert_view(&self, layer: usize, expert: usize, kind: usize) -> Option<VqView<'_>> {
        let q = self.quant;
        let all_valid = match q.format {
            VqFormat::Vq3r | VqFormat::Vq2r => q.entries >= 256,
            VqFormat::Vq4p => q.entries >= 64,
        };
        if q.vec_dim != VQ_WIDTH || !all_valid || self.options.verify_crc {
            return None;
        }
        let bank = self.banks.get(&layer)?;
        let h = bank.headers.get(expert)?;
        let rec = bank
            .map
            .get(expert * bank.record_size..(expert + 1) * bank.record_size)?;
        let (rows, cols) = self.kind_shape(kind);
        let scale_base =
            h.chan_corr_off as usize + 2 * rows_before(kind, self.config.moe_inter_dim);
        let cb0 = bank.codebook_base + kind * q.stages;
        Some(VqView {
            rows,
            cols,
            packed: q.format == VqFormat::Vq4p,
            stages: q.stages,
            entries: q.entries,
            books: self.codebooks.get(cb0..cb0 + q.stages)?,
            indices: rec.get(h.kind_off[kind] as usize..)?,
            scales: rec.get(scale_base..scale_base + 2 * rows)?,
        })
    }

    fn engram_rows(&self, name: &str, layer: usize, first: usize, out: &mut [f32]) -> Result<()> {
        let tb = self
            .engram_tables
            .get(&layer)
            .ok_or_else(|| tensor_err(&self.dir, name, "no such Engram table"))?;
        let n = check_rows_request(&tb.path, name, &[tb.rows, tb.dim], first, out.len())?;
        let data_bytes = tb.dim * tb.bits / 8;
        for (i, row) in out.chunks_exact_mut(tb.dim).enumerate().take(n) {
            let r = first + i;
            let bytes = &tb.map[r * tb.row_bytes..(r + 1) * tb.row_bytes];
            let (data, sc) = bytes.split_at(data_bytes);
            for (d, o) in row.iter_mut().enumerate() {
                let g = d / tb.group;
                let s = f16_to_f32(u16::from_le_bytes([sc[2 * g], sc[2 * g + 1]]));
                let q = if tb.bits == 8 {
                    data[d] as i8 as i32
                } else {
                    let b = data[d / 2];
                    (if d % 2 == 0 { b & 0xF } else { b >> 4 }) as i32 - 8
                };
                *o = q as f32 * s;
            }
        }
        Ok(())
    }

    fn lookup(&self, name: &str) -> Result<(Storage, Vec<usize>)> {
        if let Some(e) = self.trunk_entries.get(name) {
            return Ok((e.storage, e.shape.clone()));
        }
        match release_to_container(name) {
            ContainerName::Expert {
                layer,
                expert,
                kind,
            } if self.banks.get(&layer).is_some_and(|b| expert < b.experts) => {
                let (m, n) = self.kind_shape(kind);
                Ok((self.quant.storage(), vec![m, n]))
            }
            ContainerName::EngramTable { layer } if self.engram_tables.contains_key(&layer) => {
                let tb = &self.engram_tables[&layer];
                Ok((Storage::EngramRows, vec![tb.rows, tb.dim]))
            }
            _ => Err(tensor_err(
                &self.dir,
                name,
                "no such tensor in this container",
            )),
        }
    }
}

fn parse_expert_quant(j: &J, manifest: &Value) -> Result<ExpertQuant> {
    let q = j.get(manifest, "", "expert_quant")?;
    let fmt = j.str(q, "expert_quant", "fmt")?;
    let stages = j.usize(q, "expert_quant", "stages")?;
    let vec_dim = j.usize(q, "expert_quant", "vec_dim")?;
    let entries = j.usize(q, "expert_quant", "entries")?;
    let index_block = j.usize(q, "expert_quant", "index_block")?;
    let index_bits = match q.get("index_bits") {
        None | Some(Value::Null) => 8,
        Some(_) => j.usize(q, "expert_quant", "index_bits")?,
    };
    let format = match fmt {
        "VQ3R" => VqFormat::Vq3r,
        "VQ2R" => VqFormat::Vq2r,
        "VQ4P" => VqFormat::Vq4p,
        other => {
            return Err(j.err(
                "expert_quant.fmt",
                format!("{other:?} is not VQ3R, VQ2R or VQ4P"),
            ))
        }
    };
    if index_block != 64 {
        return Err(j.err(
            "expert_quant.index_block",
            format!("must be 64 (the record layout blocks 64 rows), got {index_block}"),
        ));
    }
    if vec_dim == 0 || vec_dim > 64 {
        return Err(j.err(
            "expert_quant.vec_dim",
            format!("{vec_dim} is outside 1..=64"),
        ));
    }
    let ok = match format {
        VqFormat::Vq3r => {
            (1..=MAX_VQ_STAGES).contains(&stages) && (1..=256).contains(&entries) && index_bits == 8
        }
        VqFormat::Vq2r => stages == 2 && (1..=256).contains(&entries) && index_bits == 8,
        VqFormat::Vq4p => stages == 4 && entries == 64 && index_bits == 6,
    };
    if !ok {
        return Err(j.err(
            "expert_quant",
            format!("{fmt} with stages {stages}, entries {entries}, index_bits {index_bits} is not a defined layout (VQ3R: 1–{MAX_VQ_STAGES} stages of 8-bit indices, ≤ 256 entries; VQ2R: the same with 2 stages; VQ4P: 4 stages × 64 entries, 6-bit)"),
        ));
    }
    Ok(ExpertQuant {
        format,
        stages,
        vec_dim,
        entries,
    })
}

fn parse_trunk(
    j: &J,
    manifest: &Value,
    prefix: &str,
    trunk_path: &Path,
    trunk_len: usize,
) -> Result<BTreeMap<String, TrunkEntry>> {
    let list = j
        .get(manifest, "", "trunk")?
        .as_array()
        .ok_or_else(|| j.err("trunk", "expected a list of tensor entries"))?;
    let mut out = BTreeMap::new();
    let mut ranges: Vec<(usize, usize, String)> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let field = format!("trunk[{i}]");
        let name = j.str(t, &field, "name")?;
        let fmt = j.usize(t, &field, "fmt")?;
        let off = j.usize(t, &field, "off")?;
        let shape = j.shape(t, &field)?;
        let bytes = j.usize(t, &field, "bytes")?;
        let (rows, cols) = rows_cols(&shape);
        let bad = |reason: String| tensor_err(trunk_path, name, reason);
        let too_big = || bad(format!("shape {shape:?} is too large for trunk.bin"));
        let (storage, group, scale_off, data_len, scale_len) = match fmt {
            0 => {
                let n = rows.checked_mul(cols).and_then(|n| n.checked_mul(4));
                (Storage::F32, 0, 0, n.ok_or_else(too_big)?, 0)
            }
            2 | 3 | 7 => {
                let group = j.usize(t, &field, "group")?;
                let scale_off = j.usize(t, &field, "scale_off")?;
                if group == 0 || group % 2 != 0 || group > 1 << 16 {
                    return Err(bad(format!("group {group} must be a positive even number")));
                }
                let groups = cols.div_ceil(group);
                let storage = match fmt {
                    2 => Storage::Q8G,
                    3 => Storage::Q4G,
                    _ => Storage::Q3G,
                };
                let data = groups
                    .checked_mul(group)
                    .map(|padded| grouped_row_bytes(storage, padded))
                    .and_then(|row| rows.checked_mul(row))
                    .ok_or_else(too_big)?;
                let scales = rows.checked_mul(groups * 2).ok_or_else(too_big)?;
                (storage, group, scale_off, data, scales)
            }
            f => return Err(bad(format!("unknown trunk format {f}"))),
        };
        if Some(bytes) != data_len.checked_add(scale_len) {
            return Err(bad(format!(
                "`bytes` is {bytes}, the format and shape {shape:?} need {}",
                data_len.saturating_add(scale_len)
            )));
        }
        for (start, len) in [(off, data_len), (scale_off, scale_len)] {
            if len == 0 {
                continue;
            }
            if start.checked_add(len).is_none_or(|end| end > trunk_len) {
                return Err(fmt_err(trunk_path, start as u64, format!("tensor `{name}`: bytes {start}..{} lie beyond the end of trunk.bin ({trunk_len} bytes)", start.saturating_add(len))));
            }
            ranges.push((start, start + len, name.to_string()));
        }
        let Some(stripped) = name.strip_prefix(prefix) else {
            continue; // outside the prefix: not loaded (CONTAINER.md §2)
        };
        let canonical = container_to_release(stripped).unwrap_or_else(|| stripped.to_string());
        let entry = TrunkEntry {
            container_name: name.to_string(),
            storage,
            shape,
            off,
            group,
            scale_off,
        };
        if out.insert(canonical.clone(), entry).is_some() {
            return Err(bad(format!("a second trunk entry maps to `{canonical}`")));
        }
    }
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(fmt_err(
                trunk_path,
                w[1].0 as u64,
                format!("tensor `{}` overlaps tensor `{}`", w[1].2, w[0].2),
            ));
        }
    }
    Ok(out)
}

fn read_codebooks(path: &Path, q: &ExpertQuant) -> Result<Vec<Vec<f32>>> {
    let map = map_file(path)?;
    let b = &map[..];
    let mut out = Vec::new();
    let mut at = 0usize;
    let body = q.entries * q.vec_dim * 2;
    while at < b.len() {
        if b.len() - at < 16 {
            return Err(fmt_err(path, at as u64, "truncated codebook header"));
        }
        let h = &b[at..at + 16];
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let id = u16::from_le_bytes([h[4], h[5]]) as usize;
        let (fmt, vec_dim) = (h[6], h[7] as usize);
        let entries = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        if magic != WCBK_MAGIC {
            return Err(fmt_err(
                path,
                at as u64,
                format!(
                    "codebook {} has magic {magic:#010x}, expected WCBK",
                    out.len()
                ),
            ));
        }
        // The id field is a u16 the writers fill with the position masked to 16 bits
        // (`cid & 0xFFFF` in convert.py and make_test_container.py).
        if id != out.len() & 0xFFFF {
            return Err(fmt_err(
                path,
                at as u64 + 4,
                format!(
                    "codebook id {id} at position {}: ids must equal their position",
                    out.len()
                ),
            ));
        }
        if !q.fmt_codes(false).contains(&fmt) || vec_dim != q.vec_dim || entries != q.entries {
            return Err(fmt_err(path, at as u64 + 6, format!("codebook {id}: fmt {fmt}, vec_dim {vec_dim}, entries {entries} disagree with manifest expert_quant (fmt {:?}, vec_dim {}, entries {})", q.fmt_codes(false), q.vec_dim, q.entries)));
        }
        at += 16;
        if b.len() - at < body {
            return Err(fmt_err(
                path,
                at as u64,
                format!("codebook {id} is truncated"),
            ));
        }
        out.push(
            b[at..at + body]
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        );
        at += body;
    }
    Ok(out)
}

fn open_banks(
    dir: &Path,
    j: &J,
    manifest: &Value,
    cfg: &Config,
    q: &ExpertQuant,
    n_codebooks: usize,
) -> Result<BTreeMap<usize, Bank>> {
    let layers = j.obj(manifest, "", "layers")?;
    let mut banks = BTreeMap::new();
    let (inter, dim) = (cfg.moe_inter_dim, cfg.dim);
    let kinds = [(inter, dim), (inter, dim), (dim, inter)];
    for (k, v) in layers {
        let l = layer_key(j.file, "layers", k)?;
        let field = format!("layers.{k}");
        if l >= cfg.n_layers {
            return Err(j.err(
                &field,
                format!(
                    "layer {l} is not a backbone layer (n_layers = {})",
                    cfg.n_layers
                ),
            ));
        }
        let file = j.str(v, &field, "file")?;
        plain_file(j.file, &format!("{field}.file"), file)?;
        let experts = j.usize(v, &field, "experts")?;
        let bytes = j.usize(v, &field, "bytes")?;
        let codebook_base = j.usize(v, &field, "codebook_base")?;
        if experts != cfg.n_routed_experts {
            return Err(j.err(
                &format!("{field}.experts"),
                format!(
                    "{experts} records, the config has {} routed experts",
                    cfg.n_routed_experts
                ),
            ));
        }
        if bytes == 0 || bytes % experts != 0 || (bytes / experts) % RECORD_ALIGN != 0 {
            return Err(j.err(&format!("{field}.bytes"), format!("{bytes} bytes do not make {experts} records of a multiple of {RECORD_ALIGN} bytes")));
        }
        // Checked: a manifest may state any value, and an overflow must be a refusal.
        let codebook_end = kinds
            .len()
            .checked_mul(q.stages)
            .and_then(|n| n.checked_add(codebook_base));
        if codebook_end.is_none_or(|end| end > n_codebooks) {
            return Err(j.err(
                &format!("{field}.codebook_base"),
                format!(
                    "{codebook_base} + {} codebooks exceeds the {n_codebooks} in codebooks.bin",
                    3 * q.stages
                ),
            ));
        }
        let path = dir.join(file);
        let map = map_file(&path)?;
        if map.len() != bytes {
            return Err(fmt_err(&path, map.len().min(bytes) as u64, format!("bank is {} bytes, the manifest says {bytes} (truncated or padded bank refused)", map.len())));
        }
        let record_size = bytes / experts;
        for (kind, &(_, n)) in kinds.iter().enumerate() {
            if n % q.vec_dim != 0 {
                return Err(fmt_err(
                    &path,
                    0,
                    format!(
                        "expert kind {kind}: {n} columns are not a multiple of vec_dim {}",
                        q.vec_dim
                    ),
                ));
            }
        }
        let index_len =
            |(m, n): (usize, usize)| m.div_ceil(64) * (n / q.vec_dim) * 64 * q.bytes_per_vector();
        let scales_len = (2 * inter + dim) * 2;
        let mut headers = Vec::with_capacity(experts);
        let mut payload_end = 0;
        for e in 0..experts {
            let at = e * record_size;
            let hb: &[u8; WEXP_HEADER_BYTES] = map[at..at + WEXP_HEADER_BYTES]
                .try_into()
                .expect("48 bytes");
            let h = WexpHeader::parse(hb);
            let bad = |off: usize, reason: String| {
                fmt_err(
                    &path,
                    (at + off) as u64,
                    format!("record {e} (expert {e} of layer {l}): {reason}"),
                )
            };
            if h.magic != WEXP_MAGIC {
                return Err(bad(
                    0,
                    format!("bad magic {:#010x}, expected WEXP", h.magic),
                ));
            }
            if h.layer as usize != l {
                return Err(bad(
                    4,
                    format!("header says layer {}, bank is layer {l}", h.layer),
                ));
            }
            if h.expert_id as usize != e {
                return Err(bad(
                    6,
                    format!("header says expert {}, record position is {e}", h.expert_id),
                ));
            }
            if !q.fmt_codes(true).contains(&h.fmt) {
                return Err(bad(
                    8,
                    format!(
                        "fmt {} disagrees with the manifest's {:?} (record fmt {:?})",
                        h.fmt,
                        q.format,
                        q.fmt_codes(true)
                    ),
                ));
            }
            if h.codebook_id as usize != codebook_base {
                return Err(bad(
                    10,
                    format!(
                        "codebook_id {} differs from the layer's codebook_base {codebook_base}",
                        h.codebook_id
                    ),
                ));
            }
            if h.lowrank_id != 0 {
                return Err(bad(
                    12,
                    format!("lowrank_id must be 0, got {}", h.lowrank_id),
                ));
            }
            if h.rec_4k_blocks as usize * RECORD_ALIGN != record_size {
                return Err(bad(
                    16,
                    format!(
                        "rec_4k_blocks {} ≠ record size {record_size} / 4096",
                        h.rec_4k_blocks
                    ),
                ));
            }
            // gate, up, down index blocks then the scales, in order, inside the record.
            let mut cursor = WEXP_HEADER_BYTES;
            let regions = [
                (20usize, h.kind_off[0] as usize, index_len(kinds[0])),
                (24, h.kind_off[1] as usize, index_len(kinds[1])),
                (28, h.kind_off[2] as usize, index_len(kinds[2])),
                (32, h.chan_corr_off as usize, scales_len),
            ];
            for (hoff, start, len) in regions {
                if start < cursor || start.checked_add(len).is_none_or(|end| end > record_size) {
                    return Err(bad(hoff, format!("section at {start} (+{len} bytes) overlaps the previous one or leaves the {record_size}-byte record")));
                }
                cursor = start + len;
            }
            if e == 0 {
                payload_end = cursor;
            } else if cursor != payload_end {
                return Err(bad(32, "records of one bank must share one layout".into()));
            }
            headers.push(h);
        }
        banks.insert(
            l,
            Bank {
                path,
                map,
                experts,
                record_size,
                codebook_base,
                payload_end,
                headers,
            },
        );
    }
    Ok(banks)
}

/// One of the two files holding the Engram hashing constants of a container whose config has
/// Engram layers. A missing one is named with what needs it: WASTE's `convert.py` (8d5405d8)
/// writes them only on its `--reclaim` path, so a default conversion lacks both, and its
/// `tools/ds41_engram.py --src RELEASE --out DIR` makes them.
fn engram_side_file(dir: &Path, name: &str, cfg: &Config) -> Result<std::path::PathBuf> {
    let path = dir.join(name);
    if path.exists() {
        return Ok(path);
    }
    let why = format!(
        "missing: the config has Engram layers {:?} (engram_layer_ids), whose hashing constants \
         a container carries in engram.json and engram-tokmap.bin (CONTAINER.md §6); WASTE's \
         tools/ds41_engram.py derives both from the release",
        cfg.engram_layer_ids
    );
    Err(Error::Io {
        path,
        source: std::io::Error::new(std::io::ErrorKind::NotFound, why),
    })
}

/// `engram.json` (CONTAINER.md §6): typed constants, checked against the config and the
/// manifest; moves the compressed pad into the config.
fn read_engram_json(path: &Path, cfg: &mut Config) -> Result<EngramHashConstants> {
    let v = read_json(path)?;
    let j = J { file: path };
    let pad = j
        .get(&v, "", "pad_id")?
        .as_i64()
        .ok_or_else(|| j.err("pad_id", "expected an integer"))?;
    let layers_v = j
        .get(&v, "", "layers")?
        .as_array()
        .ok_or_else(|| j.err("layers", "expected a list"))?;
    let mut layers = Vec::new();
    for (i, l) in layers_v.iter().enumerate() {
        let field = format!("layers[{i}]");
        let parse = |key: &str| -> Result<Value> { Ok(j.get(l, &field, key)?.clone()) };
        let multipliers: Vec<i64> =
            serde_json::from_value(parse("multipliers")?).map_err(|_| {
                j.err(
                    &format!("{field}.multipliers"),
                    "expected a list of integers",
                )
            })?;
        let primes: Vec<Vec<u64>> = serde_json::from_value(parse("primes")?)
            .map_err(|_| j.err(&format!("{field}.primes"), "expected [n-2][head] integers"))?;
        let offsets: Vec<u64> = serde_json::from_value(parse("offsets")?)
            .map_err(|_| j.err(&format!("{field}.offsets"), "expected a list of integers"))?;
        layers.push(EngramLayerHash {
            layer: j.usize(l, &field, "layer")?,
            multipliers,
            primes,
            offsets,
        });
    }
    let k = EngramHashConstants {
        max_ngram_size: j.usize(&v, "", "max_ngram_size")?,
        n_heads: j.usize(&v, "", "n_heads")?,
        compressed_vocab_size: j.usize(&v, "", "compressed_vocab_size")?,
        pad: EngramPad::Compressed(pad),
        layers,
    };
    let head_dim = j.usize(&v, "", "head_dim")?;
    if head_dim != cfg.engram_head_dim {
        return Err(j.err(
            "head_dim",
            format!(
                "{head_dim} but the manifest config says engram_head_dim {}",
                cfg.engram_head_dim
            ),
        ));
    }
    if k.compressed_vocab_size != cfg.engram_compressed_vocab_size {
        return Err(j.err(
            "compressed_vocab_size",
            format!(
                "{} but the manifest config says {}",
                k.compressed_vocab_size, cfg.engram_compressed_vocab_size
            ),
        ));
    }
    k.check_against(cfg, "engram.json")
        .map_err(|e| crate::config::in_file_err(path, e))?;
    // The oracle uses engram.json's pad directly as a compressed id (CONTAINER.md §11.3 item 9).
    cfg.engram_pad_id = pad;
    cfg.engram_pad_is_compressed = true;
    cfg.validate_container()
        .map_err(|e| crate::config::in_file_err(path, e))?;
    Ok(k)
}

fn open_engram_tables(
    dir: &Path,
    j: &J,
    manifest: &Value,
    cfg: &Config,
) -> Result<BTreeMap<usize, EngramTable>> {
    let mut out = BTreeMap::new();
    let Some(obj) = manifest.get("engram").filter(|v| !v.is_null()) else {
        return Ok(out);
    };
    let obj = obj
        .as_object()
        .ok_or_else(|| j.err("engram", "expected an object"))?;
    for (k, v) in obj {
        let l = layer_key(j.file, "engram", k)?;
        let field = format!("engram.{k}");
        let Some(i) = cfg.engram_index(l) else {
            return Err(j.err(
                &field,
                format!(
                    "layer {l} is not in the config's engram_layer_ids {:?}",
                    cfg.engram_layer_ids
                ),
            ));
        };
        let rows = j.usize(v, &field, "rows")?;
        let dim = j.usize(v, &field, "dim")?;
        let group = j.usize(v, &field, "group")?;
        let bits = j.usize(v, &field, "bits")?;
        let row_bytes = j.usize(v, &field, "row_bytes")?;
        let bytes = j.usize(v, &field, "bytes")?;
        if bits != 4 && bits != 8 {
            return Err(j.err(
                &format!("{field}.bits"),
                format!("must be 4 or 8, got {bits}"),
            ));
        }
        if group == 0 || dim % group != 0 || (bits == 4 && dim % 2 != 0) {
            return Err(j.err(
                &format!("{field}.group"),
                format!("dim {dim} must be a multiple of group {group} (and even for 4 bits)"),
            ));
        }
        if row_bytes != dim * bits / 8 + dim / group * 2 {
            return Err(j.err(
                &format!("{field}.row_bytes"),
                format!(
                    "{row_bytes} ≠ dim·bits/8 + (dim/group)·2 = {}",
                    dim * bits / 8 + dim / group * 2
                ),
            ));
        }
        if rows as u64 != cfg.engram_num_embeddings[i] {
            return Err(j.err(
                &format!("{field}.rows"),
                format!(
                    "{rows} but engram_num_embeddings[{i}] (= the sum of the layer's primes) is {}",
                    cfg.engram_num_embeddings[i]
                ),
            ));
        }
        if dim != cfg.engram_head_dim {
            return Err(j.err(
                &format!("{field}.dim"),
                format!("{dim} but engram_head_dim is {}", cfg.engram_head_dim),
            ));
        }
        if rows.checked_mul(row_bytes) != Some(bytes) {
            // A whole number of larger rows is worth naming: WASTE's convert.py (8d5405d8) at
            // `--engram-bits 8` writes each row's int8 codes and f16 scales through an int16
            // promotion, two bytes per byte, under the 1-byte row_bytes it states.
            let per_row = (rows > 0 && bytes % rows == 0)
                .then(|| format!(": {} bytes per row", bytes / rows))
                .unwrap_or_default();
            return Err(j.err(
                &format!("{field}.bytes"),
                format!("{bytes} ≠ rows·row_bytes = {rows}·{row_bytes}{per_row}"),
            ));
        }
        let path = dir.join(format!("engram-L{l}.bin"));
        let map = map_file(&path)?;
        if map.len() != bytes {
            return Err(fmt_err(
                &path,
                map.len().min(bytes) as u64,
                format!("table is {} bytes, the manifest says {bytes}", map.len()),
            ));
        }
        out.insert(
            l,
            EngramTable {
                path,
                map,
                rows,
                dim,
                group,
                bits,
                row_bytes,
            },
        );
    }
    Ok(out)
}

fn read_tokmap(path: &Path, cfg: &Config) -> Result<Vec<i32>> {
    let b = read_file(
        path,
        4 * cfg.vocab_size as u64,
        "token map of vocab_size int32 entries",
    )?;
    if b.len() % 4 != 0 {
        return Err(fmt_err(
            path,
            b.len() as u64,
            "length is not a multiple of 4 (int32 entries)",
        ));
    }
    let map: Vec<i32> = b
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    super::release::check_token_map(path, &map, cfg)?;
    Ok(map)
}

/// A container's `vision.json` (CONTAINER.md §7), where present: the vision tower's config and
/// the image token, added to `cfg`. Read by every way into a container's config, so a tower is
/// never seen by one reader and missed by another.
pub(crate) fn add_vision_json(dir: &Path, cfg: &mut Config) -> Result<()> {
    let path = dir.join("vision.json");
    if !present(&path) {
        return Ok(());
    }
    let bytes = read_file(&path, crate::io::MAX_JSON_BYTES, "JSON metadata file")?;
    let v = parse_json_bytes(&path, &bytes)?;
    crate::config::container_vision(&v, cfg).map_err(|e| crate::config::in_file_err(&path, e))
}

/// `specials.json`: `[{"id": N, "text": "…"}]`, every JSON escape decoded (CONTAINER.md §7).
pub fn read_specials(path: &Path, cfg: &Config) -> Result<Vec<Special>> {
    let bytes = read_file(path, crate::io::MAX_JSON_BYTES, "JSON metadata file")?;
    let v = parse_json_bytes(path, &bytes)?;
    let list: Vec<Special> = serde_json::from_value(v).map_err(|e| {
        fmt_err(
            path,
            0,
            format!("expected [{{\"id\": N, \"text\": \"…\"}}]: {e}"),
        )
    })?;
    if let Some(s) = list.iter().find(|s| s.id as usize >= cfg.vocab_size) {
        return Err(fmt_err(
            path,
            0,
            format!(
                "special {:?} has id {} ≥ vocab_size {}",
                s.text, s.id, cfg.vocab_size
            ),
        ));
    }
    Ok(list)
}

impl Checkpoint for ContainerCheckpoint {
    fn layout(&self) -> Layout {
        Layout::Container
    }
    fn config(&self) -> &Config {
        &self.config
    }
    fn contains(&self, name: &str) -> bool {
        self.lookup(name).is_ok()
    }
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.trunk_entries.keys().cloned().collect();
        for (&l, b) in &self.banks {
            for e in 0..b.experts {
                v.extend((0..3).map(|k| expert_name(l, e, k)));
            }
        }
        v.extend(
            self.engram_tables
                .keys()
                .map(|l| format!("layers.{l}.engram.embed.weight")),
        );
        v.sort();
        v
    }
    fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.lookup(name)?.1)
    }
    fn storage(&self, name: &str) -> Result<Storage> {
        Ok(self.lookup(name)?.0)
    }
    fn stored_bytes(&self, name: &str) -> Result<Option<u64>> {
        if let Some(e) = self.trunk_entries.get(name) {
            // The trunk layout (CONTAINER.md §4): grouped rows are padded to whole groups,
            // with one f16 scale per group.
            let n: usize = e.shape.iter().product();
            let cols = e.shape.last().copied().unwrap_or(1).max(1);
            let rows = n / cols;
            let groups = rows * cols.div_ceil(e.group.max(1));
            let padded = cols.div_ceil(e.group.max(1)) * e.group;
            return Ok(match e.storage {
                Storage::F32 => Some(4 * n as u64),
                Storage::F16 | Storage::Bf16 => Some(2 * n as u64),
                Storage::Q8G | Storage::Q4G | Storage::Q3G => {
                    Some((rows * grouped_row_bytes(e.storage, padded) + 2 * groups) as u64)
                }
                _ => None,
            });
        }
        match release_to_container(name) {
            ContainerName::Expert { layer, kind, .. } => {
                self.lookup(name)?;
                Ok(Some(if kind == 0 {
                    self.banks[&layer].record_size as u64
                } else {
                    0
                }))
            }
            ContainerName::EngramTable { layer } => {
                self.lookup(name)?;
                let t = &self.engram_tables[&layer];
                Ok(Some((t.rows * t.row_bytes) as u64))
            }
            _ => self.lookup(name).map(|_| None),
        }
    }
    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let (_, shape) = self.lookup(name)?;
        let mut out = vec![0.0; shape.iter().product()];
        self.rows_f32(name, 0, &mut out)?;
        Ok(out)
    }
    fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> Result<()> {
        if let Some(e) = self.trunk_entries.get(name) {
            return self.trunk_rows(name, e, first, out);
        }
        match release_to_container(name) {
            ContainerName::Expert {
                layer,
                expert,
                kind,
            } => self.expert_rows(name, layer, expert, kind, first, out),
            ContainerName::EngramTable { layer } => self.engram_rows(name, layer, first, out),
            _ => Err(tensor_err(
                &self.dir,
                name,
                "no such tensor in this container",
            )),
        }
    }
    fn quant_view(&self, name: &str) -> Result<Option<QuantView<'_>>> {
        self.lookup(name)?;
        Ok(None)
    }
    fn weight_view(&self, name: &str) -> Result<Option<WeightView<'_>>> {
        let Some(e) = self.trunk_entries.get(name) else {
            // Experts are VQ views where the kernels may read them, Engram rows are read with
            // `rows_f32`. (No `lookup`: it clones the shape, and this runs on every decode
            // step.)
            return match release_to_container(name) {
                ContainerName::Expert {
                    layer,
                    expert,
                    kind,
                } => Ok(self.expert_view(layer, expert, kind).map(WeightView::Vq)),
                ContainerName::EngramTable { .. } => Ok(None),
                _ => self.lookup(name).map(|_| None),
            };
        };
        let [rows, cols] = e.shape[..] else {
            return Ok(None);
        };
        let t = &self.trunk[..];
        Ok(match e.storage {
            Storage::F32 => t.get(e.off..).map(|bytes| WeightView::Dense {
                dtype: DenseDtype::F32,
                rows,
                cols,
                bytes,
            }),
            Storage::Q8G | Storage::Q4G => {
                let padded = cols.div_ceil(e.group) * e.group;
                let q8 = e.storage == Storage::Q8G;
                match (t.get(e.off..), t.get(e.scale_off..)) {
                    (Some(codes), Some(scales)) => Some(WeightView::Grouped {
                        bits: if q8 { 8 } else { 4 },
                        rows,
                        cols,
                        group: e.group,
                        row_bytes: if q8 { padded } else { padded / 2 },
                        codes,
                        scales,
                    }),
                    _ => None,
                }
            }
            _ => None,
        })
    }
    fn engram_constants(&self) -> Result<EngramHashConstants> {
        self.engram.clone().ok_or_else(|| Error::Config {
            field: "engram_layer_ids".into(),
            rule: "this container has no Engram layers".into(),
        })
    }
    fn verify_unchanged(&self) -> Result<()> {
        self.trunk.check_unchanged()?;
        for bank in self.banks.values() {
            bank.map.check_unchanged()?;
        }
        for table in self.engram_tables.values() {
            table.map.check_unchanged()?;
        }
        Ok(())
    }
    fn engram_token_map(&self) -> Result<Option<Vec<i32>>> {
        Ok(self.tokmap.clone())
    }
}

/// Bytes of one row of a grouped trunk tensor with `padded` (whole groups of) columns
/// (CONTAINER.md §3): Q8G a byte per value, Q4G a nibble; Q3G (WASTE's `quantize_q3g`, written
/// by `convert.py --trunk-bits 3`) three bits per value, LSB-first, then one guard byte.
fn grouped_row_bytes(storage: Storage, padded: usize) -> usize {
    match storage {
        Storage::Q8G => padded,
        Storage::Q4G => padded / 2,
        _ => (3 * padded).div_ceil(8) + 1,
    }
}

/// Scale rows of the kinds before kind κ in a record: gate M, then up M, then down.
fn rows_before(kind: usize, inter: usize) -> usize {
    match kind {
        0 => 0,
        1 => inter,
        _ => 2 * inter,
    }
}
