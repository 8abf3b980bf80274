//! Session state files: save a sequence's complete decode state and continue it bit-exactly
//! later, in another process (what the state is: MODEL.md §7.1, §8.3). The byte format
//! is specified in `docs/STATE.md`; in short:
//!
//! ```text
//! 0   magic      8 bytes  "DS41STAT"
//! 8   version    u32 LE   1
//! 12  header_len u32 LE   bytes of the JSON header
//! 16  payload_len u64 LE  bytes of the payload
//! 24  reserved   u64      0
//! 32  sha256     32 bytes over header ‖ payload
//! 64  header     JSON: fingerprint, position, published index_k owner, array table
//! …   payload    the arrays of the table, in table order (f32 / i64, little-endian)
//! ```
//!
//! Loading never trusts a byte it has not checked: the file length must equal
//! `64 + header_len + payload_len` before anything past the prefix is read; the checksum is
//! verified before the header is parsed; the header's array table must add up to
//! `payload_len`; the fingerprint must equal the restoring model's and run options' (the
//! error names the first differing field); every array must have the size the model implies,
//! and no element a run could not have written (an unreached slot that is not as a fresh one,
//! an Engram id out of range).
//! Errors are [`Error::Format`] values naming the file, byte offset and field; nothing panics.
//! Writing goes to a temporary file in the target directory, is synced, then renamed over the
//! target, so a crash leaves either the old file or the new one.

pub mod metamorphic;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::model::engram::DEAD;
use crate::model::{CompressedState, IndexKeys, Model, Options, Session, SessionState};
use crate::{Error, Result};

pub const MAGIC: &[u8; 8] = b"DS41STAT";
pub const VERSION: u32 = 1;
/// Bytes before the JSON header.
pub const PREFIX_LEN: usize = 64;
/// A header larger than this is refused before it is read (a real one is a few KiB).
const MAX_HEADER_LEN: u32 = 16 << 20;

/// The config fields and run options that decide a state's shape and meaning, in a fixed
/// order. Two states are compatible exactly when these are equal.
pub fn fingerprint(cfg: &Config, options: &Options) -> Map<String, Value> {
    let mut f = Map::new();
    let mut put = |k: &str, v: Value| {
        f.insert(k.to_string(), v);
    };
    put("dim", cfg.dim.into());
    put("hc_mult", cfg.hc_mult.into());
    put("n_layers", cfg.n_layers.into());
    put("head_dim", cfg.head_dim.into());
    put("rope_head_dim", cfg.rope_head_dim.into());
    put("window_size", cfg.window_size.into());
    put("compress_ratios", cfg.compress_ratios.clone().into());
    put("kv_source_layers", cfg.kv_source_layers.clone().into());
    put(
        "index_source_layers",
        cfg.index_source_layers.clone().into(),
    );
    put("candidate_source_layer", cfg.candidate_source_layer.into());
    put("index_head_dim", cfg.index_head_dim.into());
    put("engram_layer_ids", cfg.engram_layer_ids.clone().into());
    put(
        "engram_num_embeddings",
        cfg.engram_num_embeddings.clone().into(),
    );
    put("engram_max_ngram_size", cfg.engram_max_ngram_size.into());
    put(
        "engram_compressed_vocab_size",
        cfg.engram_compressed_vocab_size.into(),
    );
    put("vocab_size", cfg.vocab_size.into());
    put("numerics", options.numerics.as_str().into());
    put("index_k", options.index_k.as_str().into());
    put("defects", options.defects.to_string().into());
    f
}

/// One array of the payload, as listed in the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayEntry {
    /// Field path, e.g. `layers.2.window` or `engram_history`.
    pub name: String,
    /// `f32` or `i64`.
    pub dtype: String,
    /// Number of elements.
    pub len: u64,
}

/// The JSON header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub fingerprint: Map<String, Value>,
    /// Tokens processed (the position of the next token).
    pub position: u64,
    /// As-shipped `index_k`: the layer whose index keys are currently published (`null` = none
    /// yet). Recorded in every mode; only the as-shipped hand-off reads it.
    pub published_index_k: Option<u64>,
    /// The payload arrays in order.
    pub arrays: Vec<ArrayEntry>,
}

fn elem_size(dtype: &str) -> Option<u64> {
    match dtype {
        "f32" => Some(4),
        "i64" => Some(8),
        _ => None,
    }
}

/// The payload arrays of a state, in file order (names, data).
enum Data<'a> {
    F32(&'a [f32]),
    I64(&'a [i64]),
}

fn arrays(state: &SessionState) -> Vec<(String, Data<'_>)> {
    let mut v = Vec::new();
    for (l, layer) in state.layers.iter().enumerate() {
        v.push((format!("layers.{l}.window"), Data::F32(&layer.window)));
        if let Some(c) = &layer.compressed {
            v.push((format!("layers.{l}.latents"), Data::F32(&c.latents)));
            v.push((
                format!("layers.{l}.index_keys"),
                Data::F32(c.index_keys.rows()),
            ));
            v.push((format!("layers.{l}.group_kv"), Data::F32(&c.group_kv)));
            v.push((format!("layers.{l}.group_score"), Data::F32(&c.group_score)));
        }
    }
    v.push(("engram_history".into(), Data::I64(&state.engram_history)));
    v
}

/// Serialise `state` (saved under `cfg` and `options`) to the file format.
pub fn encode(state: &SessionState, cfg: &Config, options: &Options) -> Result<Vec<u8>> {
    let arrays = arrays(state);
    let header = Header {
        fingerprint: fingerprint(cfg, options),
        position: state.position as u64,
        published_index_k: state.published_index_k.map(|l| l as u64),
        arrays: arrays
            .iter()
            .map(|(name, d)| ArrayEntry {
                name: name.clone(),
                dtype: match d {
                    Data::F32(_) => "f32".into(),
                    Data::I64(_) => "i64".into(),
                },
                len: match d {
                    Data::F32(x) => x.len() as u64,
                    Data::I64(x) => x.len() as u64,
                },
            })
            .collect(),
    };
    let header_bytes =
        serde_json::to_vec(&header).map_err(|e| Error::Model(format!("state header: {e}")))?;
    let mut payload = Vec::new();
    for (_, d) in &arrays {
        match d {
            Data::F32(x) => x
                .iter()
                .for_each(|v| payload.extend_from_slice(&v.to_le_bytes())),
            Data::I64(x) => x
                .iter()
                .for_each(|v| payload.extend_from_slice(&v.to_le_bytes())),
        }
    }
    let mut out = Vec::with_capacity(PREFIX_LEN + header_bytes.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header_bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&checksum(&header_bytes, &payload));
    out.extend_from_slice(&header_bytes);
    out.extend_from_slice(&payload);
    Ok(out)
}

fn checksum(header: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(header);
    h.update(payload);
    h.finalize().into()
}

/// The fixed prefix, decoded.
struct Prefix {
    header_len: u32,
    payload_len: u64,
    checksum: [u8; 32],
}

fn format_err(file: &Path, offset: u64, reason: impl Into<String>) -> Error {
    Error::Format {
        file: file.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

fn read_prefix(bytes: &[u8], file: &Path, file_len: u64) -> Result<Prefix> {
    if file_len < PREFIX_LEN as u64 || bytes.len() < PREFIX_LEN {
        return Err(format_err(
            file,
            0,
            format!("truncated: a state file starts with a {PREFIX_LEN}-byte prefix, the file has {file_len} bytes"),
        ));
    }
    if &bytes[0..8] != MAGIC {
        return Err(format_err(
            file,
            0,
            "magic: not a DS41 session state (expected \"DS41STAT\")",
        ));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
    let version = u32_at(8);
    if version != VERSION {
        return Err(format_err(
            file,
            8,
            format!("version: {version} is not supported (this engine reads version {VERSION})"),
        ));
    }
    let header_len = u32_at(12);
    if header_len == 0 || header_len > MAX_HEADER_LEN {
        return Err(format_err(
            file,
            12,
            format!("header_len: {header_len} is outside 1..={MAX_HEADER_LEN}"),
        ));
    }
    let payload_len = u64_at(16);
    if u64_at(24) != 0 {
        return Err(format_err(file, 24, "reserved: must be 0"));
    }
    let want = (PREFIX_LEN as u64)
        .checked_add(u64::from(header_len))
        .and_then(|v| v.checked_add(payload_len));
    if want != Some(file_len) {
        return Err(format_err(
            file,
            16,
            format!(
                "payload_len: the prefix declares {} bytes in all (64 + header {header_len} + payload {payload_len}), the file has {file_len} (truncated or extended)",
                want.map_or("more than 2^64".to_string(), |w| w.to_string())
            ),
        ));
    }
    let mut checksum = [0u8; 32];
    checksum.copy_from_slice(&bytes[32..64]);
    Ok(Prefix {
        header_len,
        payload_len,
        checksum,
    })
}

/// Parse and check a whole state file's bytes against the restoring model's config and run
/// options. `file` only names the source in errors.
pub fn decode(bytes: &[u8], file: &Path, cfg: &Config, options: &Options) -> Result<SessionState> {
    let prefix = read_prefix(bytes, file, bytes.len() as u64)?;
    decode_checked(&prefix, &bytes[PREFIX_LEN..], file, cfg, options)
}

/// Decode the header and payload (`rest` = the bytes after the prefix, whose length the prefix
/// has already been checked against).
fn decode_checked(
    prefix: &Prefix,
    rest: &[u8],
    file: &Path,
    cfg: &Config,
    options: &Options,
) -> Result<SessionState> {
    let hl = prefix.header_len as usize;
    let (header_bytes, payload) = rest.split_at(hl);
    if checksum(header_bytes, payload) != prefix.checksum {
        return Err(format_err(
            file,
            32,
            "sha256: the header and payload do not match the recorded checksum (corrupted file)",
        ));
    }
    let header: Header = serde_json::from_slice(header_bytes).map_err(|e| {
        format_err(
            file,
            PREFIX_LEN as u64,
            format!("header: invalid JSON: {e}"),
        )
    })?;

    // Fingerprint: name the first differing field.
    let want = fingerprint(cfg, options);
    for (k, v) in &want {
        match header.fingerprint.get(k) {
            Some(got) if got == v => {}
            Some(got) => {
                return Err(format_err(
                    file,
                    PREFIX_LEN as u64,
                    format!(
                        "fingerprint.{k}: the state was saved with {got}, this model/run has {v}"
                    ),
                ))
            }
            None => {
                return Err(format_err(
                    file,
                    PREFIX_LEN as u64,
                    format!("fingerprint.{k}: missing from the state"),
                ))
            }
        }
    }
    if let Some(k) = header.fingerprint.keys().find(|k| !want.contains_key(*k)) {
        return Err(format_err(
            file,
            PREFIX_LEN as u64,
            format!("fingerprint.{k}: unknown field"),
        ));
    }

    // The array table must add up to the payload length before any array is read.
    let mut total: u64 = 0;
    for a in &header.arrays {
        let size = elem_size(&a.dtype).ok_or_else(|| {
            format_err(
                file,
                PREFIX_LEN as u64,
                format!("arrays.{}: dtype `{}` is not f32 or i64", a.name, a.dtype),
            )
        })?;
        total = a
            .len
            .checked_mul(size)
            .and_then(|b| total.checked_add(b))
            .ok_or_else(|| {
                format_err(
                    file,
                    PREFIX_LEN as u64,
                    format!("arrays.{}: length overflows", a.name),
                )
            })?;
    }
    if total != prefix.payload_len {
        return Err(format_err(
            file,
            16,
            format!(
                "payload_len: the array table adds up to {total} bytes, the prefix declares {}",
                prefix.payload_len
            ),
        ));
    }

    // The expected array list for this model at this position.
    let position = usize::try_from(header.position)
        .map_err(|_| format_err(file, PREFIX_LEN as u64, "position: too large"))?;
    if let Err(Error::PositionLimit { end, max }) = cfg.check_positions(position) {
        return Err(format_err(
            file,
            PREFIX_LEN as u64,
            format!(
                "position: {end} is beyond the model's maximum of {max} positions \
                 (config max_position_embeddings)"
            ),
        ));
    }
    let mut fresh = SessionState::new(cfg);
    fresh.position = position;
    let mut cursor = Cursor {
        payload,
        offset: 0,
        base: (PREFIX_LEN + hl) as u64,
        file,
        table: &header.arrays,
        next: 0,
    };
    for (l, layer) in fresh.layers.iter_mut().enumerate() {
        let wlen = layer.window.len();
        // Slots a sequence this short never wrote hold the fresh ring's +0.0.
        let written = position.min(cfg.window_size) * cfg.head_dim;
        layer.window = cursor.array_where(
            &format!("layers.{l}.window"),
            |n| n == wlen,
            &format!("{wlen}"),
            |i, v: f32| i < written || v.to_bits() == 0,
            "a slot no position has reached must be +0.0",
        )?;
        if let Some(c) = layer.compressed.as_mut() {
            read_compressed(&mut cursor, l, c, position)?;
        }
    }
    // With Engram a compressed id, without it the token id itself (MODEL.md §6.6.1).
    let ids = if cfg.engram_layer_ids.is_empty() {
        cfg.vocab_size
    } else {
        cfg.engram_compressed_vocab_size
    };
    fresh.engram_history = cursor.array_where(
        "engram_history",
        |n| n == position,
        &format!("{position} (= position)"),
        |_, v: i64| v == DEAD || usize::try_from(v).is_ok_and(|v| v < ids),
        &format!("an id below {ids}, or {DEAD} (DEAD)"),
    )?;
    if cursor.next != header.arrays.len() {
        return Err(format_err(
            file,
            PREFIX_LEN as u64,
            format!(
                "arrays.{}: not part of this model's state",
                header.arrays[cursor.next].name
            ),
        ));
    }
    fresh.published_index_k = match header.published_index_k {
        None => None,
        Some(l) => {
            let l = l as usize;
            // Index-key owners: layers that are both KV and index sources (§6.4.5).
            let owners: Vec<usize> = cfg
                .kv_source_layers
                .iter()
                .copied()
                .filter(|i| cfg.index_source_layers.contains(i))
                .collect();
            if !owners.contains(&l) {
                return Err(format_err(file, PREFIX_LEN as u64, format!(
                    "published_index_k: layer {l} is not an index-key owner of this model (owners: {owners:?})")));
            }
            Some(l)
        }
    };
    Ok(fresh)
}

/// The compressed caches of KV source `l` at `position` (MODEL.md §7.2: entry j exists once
/// token j·r + r − 1 was processed, so there are `position div r` latents).
fn read_compressed(
    cursor: &mut Cursor,
    l: usize,
    c: &mut CompressedState,
    position: usize,
) -> Result<()> {
    let entries = position / c.ratio.max(1);
    let (hd, ihd) = (c.head_dim, c.index_head_dim);
    c.latents = cursor.f32s(
        &format!("layers.{l}.latents"),
        |n| n == entries * hd,
        &format!("{entries} × {hd} (position div ratio entries)"),
    )?;
    c.index_keys = IndexKeys::from_rows(
        ihd,
        cursor.f32s(
            &format!("layers.{l}.index_keys"),
            |n| n == entries * ihd || n == 0,
            &format!("{entries} × {ihd} or 0"),
        )?,
    );
    // The open group holds slots 0 .. position mod ratio; the others are as a consumed group
    // leaves them (`compressor`): kv +0.0, score −∞.
    let glen = c.group_kv.len();
    let filled = if glen == 0 {
        0
    } else {
        (position % c.ratio) * hd
    };
    c.group_kv = cursor.array_where(
        &format!("layers.{l}.group_kv"),
        |n| n == glen,
        &format!("{glen}"),
        |i, v: f32| i < filled || v.to_bits() == 0,
        "a slot of the open group not yet filled must be +0.0",
    )?;
    c.group_score = cursor.array_where(
        &format!("layers.{l}.group_score"),
        |n| n == glen,
        &format!("{glen}"),
        |i, v: f32| i < filled || v == f32::NEG_INFINITY,
        "a slot of the open group not yet filled must be -inf",
    )?;
    Ok(())
}

/// An element type of the payload: its `dtype` name in the table and its little-endian bytes.
trait Element: Copy + std::fmt::Debug {
    const DTYPE: &'static str;
    /// From exactly `size_of::<Self>()` bytes.
    fn from_le(b: &[u8]) -> Self;
}

impl Element for f32 {
    const DTYPE: &'static str = "f32";
    fn from_le(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Element for i64 {
    const DTYPE: &'static str = "i64";
    fn from_le(b: &[u8]) -> i64 {
        i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
    }
}

/// Reads the payload arrays in table order, checking each against the model's expectation.
struct Cursor<'a> {
    payload: &'a [u8],
    offset: usize,
    base: u64,
    file: &'a Path,
    table: &'a [ArrayEntry],
    next: usize,
}

impl Cursor<'_> {
    fn entry(
        &mut self,
        name: &str,
        dtype: &str,
        ok: impl Fn(usize) -> bool,
        want: &str,
    ) -> Result<(usize, usize)> {
        let Some(e) = self.table.get(self.next) else {
            return Err(format_err(
                self.file,
                PREFIX_LEN as u64,
                format!("arrays: `{name}` is missing (the table ends early)"),
            ));
        };
        if e.name != name || e.dtype != dtype {
            return Err(format_err(self.file, PREFIX_LEN as u64, format!(
                "arrays.{}: expected `{name}` ({dtype}) at this place in the table, found `{}` ({})", self.next, e.name, e.dtype)));
        }
        let n = usize::try_from(e.len).unwrap_or(usize::MAX);
        if !ok(n) {
            return Err(format_err(
                self.file,
                self.base + self.offset as u64,
                format!("{name}: {n} elements, this model expects {want}"),
            ));
        }
        self.next += 1;
        let start = self.offset;
        self.offset += n * elem_size(dtype).unwrap_or(4) as usize;
        Ok((start, n))
    }

    /// The next array, `name`, of a length `ok` takes.
    fn f32s(&mut self, name: &str, ok: impl Fn(usize) -> bool, want: &str) -> Result<Vec<f32>> {
        self.array_where(name, ok, want, |_, _| true, "")
    }

    /// The next array, `name`, of element type `T` and a length `ok` takes, whose every
    /// element `i` must be one `valid(i, v)` takes, else it is refused at its byte, quoting
    /// `rule`.
    fn array_where<T: Element>(
        &mut self,
        name: &str,
        ok: impl Fn(usize) -> bool,
        want: &str,
        valid: impl Fn(usize, T) -> bool,
        rule: &str,
    ) -> Result<Vec<T>> {
        let (start, n) = self.entry(name, T::DTYPE, ok, want)?;
        let size = std::mem::size_of::<T>();
        let values: Vec<T> = self.payload[start..start + size * n]
            .chunks_exact(size)
            .map(T::from_le)
            .collect();
        self.check(name, start, &values, valid, rule)?;
        Ok(values)
    }

    /// The first element of the array at payload byte `start` that `valid` refuses, named.
    fn check<T: Element>(
        &self,
        name: &str,
        start: usize,
        values: &[T],
        valid: impl Fn(usize, T) -> bool,
        rule: &str,
    ) -> Result<()> {
        match values.iter().enumerate().find(|&(i, &v)| !valid(i, v)) {
            None => Ok(()),
            Some((i, v)) => Err(format_err(
                self.file,
                self.base + (start + i * std::mem::size_of::<T>()) as u64,
                format!("{name}[{i}]: {v:?}: {rule}"),
            )),
        }
    }
}

/// Write `bytes` to `path` atomically: a temporary file in the same directory, synced, then
/// renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |p: &Path, e: std::io::Error| Error::Io {
        path: p.to_path_buf(),
        source: e,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    remove_stale_temporaries(&dir, &name);
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| io(&tmp, e))?;
        f.sync_all().map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Remove `.NAME.tmp-PID` files in `dir` left by a writer of `name` that was killed before
/// its rename (PID no longer alive). Only names of exactly that form are touched; a
/// temporary of a live process (another save in progress) is left alone. Best effort: a
/// file that cannot be removed is left in place.
fn remove_stale_temporaries(dir: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether a process with this id exists (`kill(pid, 0)`: success or EPERM means it does).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Save a session's state to `path` (atomic). `model` is the session's model.
pub fn save(model: &Model, session: &Session, path: &Path) -> Result<()> {
    let bytes = encode(session.state(), model.config(), session.options())?;
    write_atomic(path, &bytes)
}

/// Read and check a state file for a model config and run options. The prefix is read first
/// and the file length checked against it before any further byte is read.
pub fn load(path: &Path, cfg: &Config, options: &Options) -> Result<SessionState> {
    let io = |e: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let (mut f, meta) = crate::io::open_regular(path)?;
    let file_len = meta.len();
    if let Some(limit) = max_file_len(cfg) {
        if file_len > limit {
            return Err(Error::TooLarge {
                path: path.to_path_buf(),
                len: file_len,
                limit,
                what: "state file of this model at its maximum position",
            });
        }
    }
    let mut prefix_bytes = [0u8; PREFIX_LEN];
    let got = read_up_to(&mut f, &mut prefix_bytes).map_err(io)?;
    let prefix = read_prefix(&prefix_bytes[..got], path, file_len)?;
    let rest_len = file_len - PREFIX_LEN as u64; // = header_len + payload_len, checked
    let mut rest = vec![
        0u8;
        usize::try_from(rest_len).map_err(|_| format_err(
            path,
            16,
            "payload_len: too large for this machine"
        ))?
    ];
    f.read_exact(&mut rest).map_err(io)?;
    decode_checked(&prefix, &rest, path, cfg, options)
}

/// The largest state file `cfg` allows: the prefix, the largest header, and the payload of
/// a state at the config's maximum position (`None` when the config states no maximum).
fn max_file_len(cfg: &Config) -> Option<u64> {
    let max = cfg.max_position? as u64;
    let fresh = SessionState::new(cfg);
    let mut payload: u64 = 8 * max; // engram_history
    for layer in &fresh.layers {
        payload += 4 * layer.window.len() as u64;
        if let Some(c) = &layer.compressed {
            let entries = max / c.ratio.max(1) as u64;
            payload += 4 * entries * (c.head_dim + c.index_head_dim) as u64;
            payload += 4 * (c.group_kv.len() + c.group_score.len()) as u64;
        }
    }
    Some(PREFIX_LEN as u64 + u64::from(MAX_HEADER_LEN) + payload)
}

fn read_up_to(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Load `path` into `session` (replacing its whole state). `model` is the session's model.
pub fn restore(model: &Model, session: &mut Session, path: &Path) -> Result<()> {
    let state = load(path, model.config(), session.options())?;
    session.set_state(state)
}
