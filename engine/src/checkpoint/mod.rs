//! Weight access by canonical (release) tensor name, for both checkpoint layouts
//! (MODEL.md §4, CONTAINER.md §1–§8).
//!
//! * [`open`] detects the layout of a directory and returns a `Box<dyn Checkpoint>`;
//! * [`release`]: `config.json` + `model.safetensors` (or an index + shards), memory-mapped;
//! * [`container`]: a WASTE v0 container directory;
//! * [`names`]: the tensors a config implies (names, logical shapes, allowed storage) and the
//!   container ↔ release name mapping.
//!
//! Opening checks everything that can be checked without reading weights: the config
//! (`cfg_sane`), the presence, shape and storage of every tensor the config implies, file
//! structure (safetensors headers, bank record headers, codebooks, Engram tables). Weights are
//! dequantised only when asked for, a tensor, a row range or one expert at a time.
//!
//! The trait below is the shared interface the forward
//! pass codes against.

pub mod container;
pub mod names;
pub mod release;

use crate::config::{Config, EngramHashConstants};
use crate::{Error, Result};
use std::path::Path;

pub use container::ContainerCheckpoint;
pub use release::ReleaseCheckpoint;

/// Which on-disk layout a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// The official release: `config.json` + safetensors.
    Release,
    /// The WASTE v0 container directory.
    Container,
}

/// How a tensor is stored, so the upstream numerics can pick the matching linear (MODEL.md
/// §4.8) and a report can say what was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Storage {
    F32,
    Bf16,
    F16,
    /// FP8 e4m3 with E8M0 32x32 block scales.
    Fp8Block,
    /// FP8 e4m3 rows with one E8M0 scale per row and 32 columns (release Engram tables).
    Fp8Rows,
    /// Packed FP4 (e2m1) with per-row-per-32 E8M0 scales.
    Fp4,
    /// Container int8 with f16 group scales.
    Q8G,
    /// Container int4 with f16 group scales.
    Q4G,
    /// Container 3-bit values (a bit stream per row plus a guard byte) with f16 group scales.
    Q3G,
    /// Container VQ3R expert record.
    Vq3r,
    /// Container VQ4P expert record (6-bit indices, four stages).
    Vq4p,
    /// Container VQ2R expert record (VQ3R's coding with two stages).
    Vq2r,
    /// Container Engram rows (int4/int8 with f16 group scales).
    EngramRows,
    /// An E8M0 scale tensor (`<w>.scale` of the release), decoded to powers of two.
    E8m0,
}

/// Which quantised layout a [`QuantView`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum QuantKind {
    /// `codes`: e4m3 `[rows, cols]`; `scales`: E8M0 `[ceil(rows/32), ceil(cols/32)]`.
    Fp8Block,
    /// `codes`: e4m3 `[rows, cols]`; `scales`: E8M0 `[rows, ceil(cols/32)]`.
    Fp8Rows,
    /// `codes`: packed e2m1 `[rows, cols/2]` (low nibble = even column); `scales`: E8M0
    /// `[rows, ceil(cols/32)]`.
    Fp4,
}

/// The stored codes and scales of a quantised release weight, borrowed from the mapped file,
/// for block-exact GEMMs (MODEL.md §5.4 C1). `rows`/`cols` are the logical shape.
#[derive(Debug, Clone, Copy)]
pub struct QuantView<'a> {
    pub kind: QuantKind,
    pub rows: usize,
    pub cols: usize,
    pub codes: &'a [u8],
    pub scales: &'a [u8],
    /// Columns of the scale matrix, `ceil(cols / 32)`.
    pub scale_cols: usize,
}

impl QuantView<'_> {
    /// The E8M0 scale byte that applies to element `(r, c)`.
    #[inline]
    pub fn scale_byte(&self, r: usize, c: usize) -> u8 {
        let sr = match self.kind {
            QuantKind::Fp8Block => r / 32,
            QuantKind::Fp8Rows | QuantKind::Fp4 => r,
        };
        self.scales[sr * self.scale_cols + c / 32]
    }

    /// The stored code of element `(r, c)` (a whole e4m3 byte, or an e2m1 nibble).
    #[inline]
    pub fn code(&self, r: usize, c: usize) -> u8 {
        match self.kind {
            QuantKind::Fp4 => {
                let b = self.codes[r * (self.cols / 2) + c / 2];
                if c.is_multiple_of(2) {
                    b & 0xF
                } else {
                    b >> 4
                }
            }
            _ => self.codes[r * self.cols + c],
        }
    }
}

/// Columns of one VQ vector.
pub const VQ_WIDTH: usize = 8;
/// Rows whose indices of one vector position are stored together (CONTAINER.md §4.2).
pub const VQ_ROW_BAND: usize = 64;
/// Most stages a container's `expert_quant` may state (WASTE's converter writes up to 6).
pub const MAX_VQ_STAGES: usize = 8;

/// The bytes of one container VQ expert matrix `[rows, cols]` (CONTAINER.md §4.2): vector v of
/// row r (columns `8v .. 8v + 8`) is `scale[r] · Σ_stage book[stage][index]`, the stages
/// added in order from 0.0 in f32. Served only when every index is below `entries` (VQ4P's
/// six-bit indices, VQ3R's bytes with 256 entries).
#[derive(Debug, Clone, Copy)]
pub struct VqView<'a> {
    pub rows: usize,
    pub cols: usize,
    /// Four six-bit indices packed in three bytes (VQ4P), else one byte per stage (VQ3R).
    pub packed: bool,
    pub stages: usize,
    pub entries: usize,
    /// One codebook per stage, `entries × 8` f32.
    pub books: &'a [Vec<f32>],
    /// The matrix's index bytes: vector v of row r at
    /// `((r / 64 · (cols / 8) + v) · 64 + r % 64) · bytes_per_vector`.
    pub indices: &'a [u8],
    /// One f16 per row.
    pub scales: &'a [u8],
}

impl VqView<'_> {
    pub fn bytes_per_vector(&self) -> usize {
        if self.packed {
            3
        } else {
            self.stages
        }
    }

    /// The f16 scale of row `r`, as f32.
    #[inline(always)]
    pub fn scale(&self, r: usize) -> f32 {
        crate::dtype::f16_to_f32(u16::from_le_bytes([
            self.scales[2 * r],
            self.scales[2 * r + 1],
        ]))
    }

    /// Where vector `v` of row `r` starts in [`Self::indices`].
    #[inline(always)]
    pub(crate) fn index_at(&self, r: usize, v: usize) -> usize {
        ((r / VQ_ROW_BAND * (self.cols / VQ_WIDTH) + v) * VQ_ROW_BAND + r % VQ_ROW_BAND)
            * self.bytes_per_vector()
    }

    /// The stage indices of vector `v` of row `r` (`stages` of them used).
    #[inline(always)]
    pub fn indices(&self, r: usize, v: usize) -> [usize; MAX_VQ_STAGES] {
        let at = self.index_at(r, v);
        vq_indices(&self.indices[at..at + self.bytes_per_vector()], self.packed)
    }

    /// Vector `v` of row `r`: exactly the values `rows_f32` gives.
    #[inline(always)]
    pub fn vector(&self, r: usize, v: usize) -> [f32; VQ_WIDTH] {
        let mut out = [[0.0; VQ_WIDTH]];
        self.vectors(r, v, &mut out);
        out[0]
    }

    /// Vectors `v0 ..` of rows `r .. r + R` into `out` (`R · 8` columns per row): [`Self::vector`]
    /// with each row's scale decoded once and, where the rows share an index band, their
    /// indices read as one run. The usual formats' codebooks are seen as fixed-size arrays, so
    /// that an index (below 64 in VQ4P, 256 in VQ3R, by its width) needs no bounds check.
    #[inline(always)]
    pub fn vectors<const R: usize, const C: usize>(
        &self,
        r: usize,
        v0: usize,
        out: &mut [[f32; C]; R],
    ) {
        let done = match (self.packed, self.stages) {
            (true, 4) => self.vectors_from_arrays::<R, C, 64, 4>(r, v0, out),
            (false, 3) => self.vectors_from_arrays::<R, C, 256, 3>(r, v0, out),
            (false, 4) => self.vectors_from_arrays::<R, C, 256, 4>(r, v0, out),
            _ => false,
        };
        if !done {
            let books = &self.books[..self.stages];
            self.fill(
                r,
                v0,
                out,
                #[inline(always)]
                |b, s| vq_vector(book_entries(books, vq_indices(b, self.packed)), s),
            );
        }
    }

    /// The first `S` codebooks seen as `E` entries each (so that an index below `E` needs no
    /// bounds check); `None` if there are fewer or one is shorter.
    #[inline(always)]
    pub(crate) fn books_as<const E: usize, const S: usize>(
        &self,
    ) -> Option<[&[[f32; VQ_WIDTH]; E]; S]> {
        let mut books: [&[[f32; VQ_WIDTH]; E]; S] = [&[[0.0; VQ_WIDTH]; E]; S];
        for (s, book) in books.iter_mut().enumerate() {
            let b = self.books.get(s).and_then(|b| b.as_chunks().0.get(..E))?;
            *book = b.try_into().expect("E entries");
        }
        Some(books)
    }

    /// [`Self::vectors`] with each of the `S` codebooks seen as `E` entries; `false` (nothing
    /// written) if a codebook is shorter.
    #[inline(always)]
    fn vectors_from_arrays<const R: usize, const C: usize, const E: usize, const S: usize>(
        &self,
        r: usize,
        v0: usize,
        out: &mut [[f32; C]; R],
    ) -> bool {
        let Some(books) = self.books_as::<E, S>() else {
            return false;
        };
        self.fill(
            r,
            v0,
            out,
            #[inline(always)]
            |b, s| {
                let sel = vq_indices(b, self.packed);
                vq_vector(
                    books.iter().zip(sel).map(
                        #[inline(always)]
                        |(book, ix)| &book[ix],
                    ),
                    s,
                )
            },
        );
        true
    }

    /// `out` filled by `vector(index bytes, row scale)` per vector, each row's scale decoded
    /// once and, where the rows share an index band, their indices read as one run.
    #[inline(always)]
    fn fill<const R: usize, const C: usize>(
        &self,
        r: usize,
        v0: usize,
        out: &mut [[f32; C]; R],
        vector: impl Fn(&[u8], f32) -> [f32; VQ_WIDTH],
    ) {
        // Loops rather than `array::from_fn`, which stayed out of line (and without the
        // caller's target features) in the kernels' block loops.
        let mut scales = [0f32; R];
        for (i, s) in scales.iter_mut().enumerate() {
            *s = self.scale(r + i);
        }
        let bpv = self.bytes_per_vector();
        let one_band = r % VQ_ROW_BAND + R <= VQ_ROW_BAND;
        for j in 0..C / VQ_WIDTH {
            let v = v0 + j;
            if one_band {
                let run = &self.indices[self.index_at(r, v)..][..R * bpv];
                for ((row, b), &s) in out.iter_mut().zip(run.chunks_exact(bpv)).zip(&scales) {
                    row[j * VQ_WIDTH..][..VQ_WIDTH].copy_from_slice(&vector(b, s));
                }
            } else {
                for (i, (row, &s)) in out.iter_mut().zip(&scales).enumerate() {
                    let at = self.index_at(r + i, v);
                    let b = &self.indices[at..at + bpv];
                    row[j * VQ_WIDTH..][..VQ_WIDTH].copy_from_slice(&vector(b, s));
                }
            }
        }
    }
}

/// The stage indices of one VQ vector's bytes: one per byte (VQ3R), or four six-bit fields
/// low bits first (VQ4P).
#[inline(always)]
pub(crate) fn vq_indices(b: &[u8], packed: bool) -> [usize; MAX_VQ_STAGES] {
    if packed {
        let mut sel = [0; MAX_VQ_STAGES];
        sel[..4].copy_from_slice(&[
            usize::from(b[0] & 0x3F),
            usize::from((b[0] >> 6) | ((b[1] & 0x0F) << 2)),
            usize::from((b[1] >> 4) | ((b[2] & 0x03) << 4)),
            usize::from(b[2] >> 2),
        ]);
        sel
    } else {
        std::array::from_fn(|i| b.get(i).map_or(0, |&x| usize::from(x)))
    }
}

/// The entries `books[stage][sel[stage]]` of one vector, stage by stage.
#[inline(always)]
pub(crate) fn book_entries(
    books: &[Vec<f32>],
    sel: [usize; MAX_VQ_STAGES],
) -> impl Iterator<Item = &[f32; VQ_WIDTH]> {
    books.iter().zip(sel).map(
        #[inline(always)]
        |(book, ix)| {
            book[ix * VQ_WIDTH..][..VQ_WIDTH]
                .try_into()
                .expect("eight values")
        },
    )
}

/// `scale · Σ_stage entry` over eight elements, the stages' entries added in order from 0.0 in
/// f32 (CONTAINER.md §4.2).
#[inline(always)]
pub(crate) fn vq_vector<'b>(
    entries: impl Iterator<Item = &'b [f32; VQ_WIDTH]>,
    scale: f32,
) -> [f32; VQ_WIDTH] {
    let mut acc = [0.0f32; VQ_WIDTH];
    for entry in entries {
        for (a, e) in acc.iter_mut().zip(entry) {
            *a += e;
        }
    }
    acc.map(|a| scale * a)
}

/// Element type of an unquantised [`WeightView::Dense`] weight (little-endian bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum DenseDtype {
    F32,
    Bf16,
    F16,
}

impl DenseDtype {
    pub fn width(self) -> usize {
        match self {
            DenseDtype::F32 => 4,
            DenseDtype::Bf16 | DenseDtype::F16 => 2,
        }
    }
}

/// The stored bytes of a 2-D weight `[rows, cols]`, borrowed from the mapped file, in a form
/// the matrix-vector kernels decode a 32-column block at a time without an f32 copy of the
/// rows. Every variant decodes to exactly the values of `rows_f32`.
#[derive(Debug, Clone, Copy)]
pub enum WeightView<'a> {
    /// Release FP8 / FP4 codes with E8M0 scales.
    Quant(QuantView<'a>),
    /// Unquantised rows, `rows · cols · width` bytes.
    Dense {
        dtype: DenseDtype,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    },
    /// Container VQ expert rows (eight-wide vectors, every index valid).
    Vq(VqView<'a>),
    /// Container Q8G (`bits` 8: int8) or Q4G (`bits` 4: nibble − 8, low nibble first): row r
    /// is `codes[r·row_bytes ..]`, its f16 group scales `scales[r·2·ceil(cols/group) ..]`.
    Grouped {
        bits: u8,
        rows: usize,
        cols: usize,
        group: usize,
        row_bytes: usize,
        codes: &'a [u8],
        scales: &'a [u8],
    },
}

impl WeightView<'_> {
    /// `(rows, cols)` of the logical weight.
    pub fn shape(&self) -> (usize, usize) {
        match *self {
            WeightView::Quant(v) => (v.rows, v.cols),
            WeightView::Dense { rows, cols, .. } | WeightView::Grouped { rows, cols, .. } => {
                (rows, cols)
            }
            WeightView::Vq(v) => (v.rows, v.cols),
        }
    }

    /// Check that the borrowed bytes cover the shape, so a kernel can index them freely.
    pub fn check(&self) -> std::result::Result<(), String> {
        let need = |what: &str, have: usize, want: Option<usize>| match want {
            Some(w) if have >= w => Ok(()),
            _ => Err(format!(
                "{what} hold {have} bytes, the shape {:?} needs {want:?}",
                self.shape()
            )),
        };
        match *self {
            WeightView::Quant(v) => {
                let code_bytes = match v.kind {
                    QuantKind::Fp4 if v.cols % 2 != 0 => {
                        return Err(format!("packed FP4 with an odd width {}", v.cols))
                    }
                    QuantKind::Fp4 => v.rows.checked_mul(v.cols / 2),
                    _ => v.rows.checked_mul(v.cols),
                };
                let scale_rows = match v.kind {
                    QuantKind::Fp8Block => v.rows.div_ceil(32),
                    _ => v.rows,
                };
                if v.scale_cols < v.cols.div_ceil(32) {
                    return Err(format!(
                        "{} scale columns for {} columns",
                        v.scale_cols, v.cols
                    ));
                }
                need("codes", v.codes.len(), code_bytes)?;
                need(
                    "scales",
                    v.scales.len(),
                    scale_rows.checked_mul(v.scale_cols),
                )
            }
            WeightView::Dense {
                dtype,
                rows,
                cols,
                bytes,
            } => need(
                "rows",
                bytes.len(),
                rows.checked_mul(cols)
                    .and_then(|n| n.checked_mul(dtype.width())),
            ),
            WeightView::Vq(v) => {
                if v.cols % VQ_WIDTH != 0 || v.books.len() != v.stages || v.stages > MAX_VQ_STAGES {
                    return Err(format!("{} columns in {} stages", v.cols, v.stages));
                }
                if let Some(b) = v.books.iter().find(|b| b.len() < v.entries * VQ_WIDTH) {
                    return Err(format!("a codebook of {} values", b.len()));
                }
                let vectors = v.rows.div_ceil(VQ_ROW_BAND) * VQ_ROW_BAND * (v.cols / VQ_WIDTH);
                need(
                    "indices",
                    v.indices.len(),
                    vectors.checked_mul(v.bytes_per_vector()),
                )?;
                need("scales", v.scales.len(), v.rows.checked_mul(2))
            }
            WeightView::Grouped {
                bits,
                rows,
                cols,
                group,
                row_bytes,
                codes,
                scales,
            } => {
                if group == 0 || !matches!(bits, 4 | 8) {
                    return Err(format!("group {group}, bits {bits}"));
                }
                let row_need = if bits == 8 { cols } else { cols.div_ceil(2) };
                if row_bytes < row_need {
                    return Err(format!("row of {row_bytes} bytes for {cols} columns"));
                }
                need("codes", codes.len(), rows.checked_mul(row_bytes))?;
                need(
                    "scales",
                    scales.len(),
                    rows.checked_mul(2 * cols.div_ceil(group)),
                )
            }
        }
    }
}

/// Read access to the weights of one checkpoint. Names are canonical release names
/// (`layers.3.attn.wq_a.weight`); a container maps its own names onto them. Nothing here
/// materialises a whole checkpoint: each call dequantises only what it is asked for.
///
/// Every tensor [`names::expected_tensors`] lists for the config is guaranteed present with
/// its logical shape once [`open`] has returned.
pub trait Checkpoint: Send + Sync {
    fn layout(&self) -> Layout;
    fn config(&self) -> &Config;
    fn contains(&self, name: &str) -> bool;
    /// Every canonical tensor name this checkpoint serves (sorted). For a release this
    /// includes the `.scale` companions; for a container, one name per expert matrix.
    /// (The default, for in-memory test doubles, lists nothing; both readers override it.)
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
    /// Logical shape of the dequantised tensor (e.g. FP4 `[out, in]`, not the packed bytes).
    fn shape(&self, name: &str) -> Result<Vec<usize>>;
    fn storage(&self, name: &str) -> Result<Storage>;
    /// Dequantise the whole tensor to f32, row-major.
    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>>;
    /// Dequantise rows `[first, first + out.len() / cols)` of a tensor into `out`. A tensor
    /// of rank r ≥ 2 is viewed as `[prod(shape[..r-1]), shape[r-1]]`; rank 1 as one row.
    /// `out.len()` must be a multiple of the row length.
    fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> Result<()>;
    /// The stored codes and scales of an FP8/FP4 release weight (`None` for any other
    /// storage, including every container tensor).
    fn quant_view(&self, name: &str) -> Result<Option<QuantView<'_>>> {
        let _ = name;
        Ok(None)
    }
    /// The stored bytes of a 2-D weight for the direct kernels (`None` when the storage has
    /// no such view, e.g. a container VQ expert: callers then read rows with `rows_f32`).
    /// The default serves the FP8/FP4 [`Checkpoint::quant_view`].
    fn weight_view(&self, name: &str) -> Result<Option<WeightView<'_>>> {
        Ok(self.quant_view(name)?.map(WeightView::Quant))
    }
    /// Bytes the tensor occupies in the checkpoint's files, as read by a forward (`None` when
    /// the reader cannot say, e.g. in-memory doubles). A container's expert record holds all
    /// three matrices of an expert: it is counted under `w1`, its `w2`/`w3` are 0.
    fn stored_bytes(&self, name: &str) -> Result<Option<u64>> {
        let _ = name;
        Ok(None)
    }
    /// Engram hashing constants (multipliers, primes, offsets, pad) for this checkpoint. The
    /// default applies the release recipe to `config()` (MODEL.md §6.6.1); a container states
    /// its own in `engram.json`.
    fn engram_constants(&self) -> Result<EngramHashConstants> {
        EngramHashConstants::for_release(self.config())
    }
    /// Token id → Engram compressed id when the checkpoint ships the map (a container's
    /// `engram-tokmap.bin`, a release sidecar); `None` when it must be built from the
    /// tokenizer (MODEL.md §6.6.1, `tokenizer` module).
    fn engram_token_map(&self) -> Result<Option<Vec<i32>>> {
        Ok(None)
    }
    /// Check that every memory-mapped file is still the file that was opened, with the same
    /// length and modification time ([`Error::Changed`] naming the first that is not). Call
    /// it before publishing results computed from the weights: bytes overwritten in place
    /// would otherwise silently change them. (The default, for in-memory doubles, has no
    /// files to check.)
    fn verify_unchanged(&self) -> Result<()> {
        Ok(())
    }
}

/// Open a checkpoint directory, detecting its layout: `manifest.json` ⇒ WASTE container;
/// `config.json` with `model.safetensors` or `model.safetensors.index.json` ⇒ release.
pub fn open(dir: &Path) -> Result<Box<dyn Checkpoint>> {
    let ck: Box<dyn Checkpoint> = match detect_layout(dir)? {
        Layout::Container => Box::new(ContainerCheckpoint::open(dir)?),
        Layout::Release => Box::new(ReleaseCheckpoint::open(dir)?),
    };
    pause_for_tests_after_open();
    Ok(ck)
}

/// The configuration of a checkpoint directory, read without opening its weights (the
/// release's `config.json`, or a container's `manifest.json` config with its `vision.json`).
pub fn read_config(dir: &Path) -> Result<Config> {
    match detect_layout(dir)? {
        Layout::Container => {
            let mut config = Config::from_container_manifest(&dir.join("manifest.json"))?;
            container::add_vision_json(dir, &mut config)?;
            Ok(config)
        }
        Layout::Release => Config::from_release_json(&dir.join("config.json")),
    }
}

/// Environment variable of the test hook in [`open`].
pub const PAUSE_AFTER_OPEN_ENV: &str = "DS41_TEST_PAUSE_AFTER_OPEN";

/// Test hook: with `DS41_TEST_PAUSE_AFTER_OPEN=FLAG` set, a checkpoint that has just been
/// opened (mapped and validated) creates the file FLAG and waits until it is removed (at most
/// 60 s). A test uses the pause to truncate or overwrite checkpoint files at a known point,
/// while the process still has to read the weights, and then lets it go on.
fn pause_for_tests_after_open() {
    let Some(flag) = std::env::var_os(PAUSE_AFTER_OPEN_ENV) else {
        return;
    };
    let flag = std::path::PathBuf::from(flag);
    if std::fs::write(&flag, b"opened\n").is_err() {
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while flag.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Which layout `dir` holds, from its file names alone.
pub fn detect_layout(dir: &Path) -> Result<Layout> {
    if !dir.is_dir() {
        let (kind, what) = if dir.exists() {
            (
                std::io::ErrorKind::NotADirectory,
                "not a directory (a checkpoint is a directory)",
            )
        } else {
            (std::io::ErrorKind::NotFound, "no such directory")
        };
        return Err(Error::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(kind, what),
        });
    }
    // `present`, not `is_file`: a FIFO or a device under one of these names is then refused
    // for what it is when opened, instead of the directory being reported as unrecognised.
    let present = |name: &str| crate::io::present(&dir.join(name));
    if present("manifest.json") {
        return Ok(Layout::Container);
    }
    if present("config.json")
        && (present("model.safetensors") || present("model.safetensors.index.json"))
    {
        return Ok(Layout::Release);
    }
    Err(Error::Format {
        file: dir.to_path_buf(),
        offset: 0,
        reason: "neither a WASTE container (manifest.json) nor a release checkpoint (config.json \
                 + model.safetensors or model.safetensors.index.json)"
            .into(),
    })
}

/// Helper for implementations: a tensor error.
pub(crate) fn tensor_err(file: &Path, tensor: &str, reason: impl Into<String>) -> Error {
    Error::Tensor {
        file: file.to_path_buf(),
        tensor: tensor.to_string(),
        reason: reason.into(),
    }
}

/// Helper for implementations: rows × cols view of a shape (rank 0/1 = one row).
pub(crate) fn rows_cols(shape: &[usize]) -> (usize, usize) {
    match shape.split_last() {
        None => (1, 1),
        Some((&c, rest)) => (rest.iter().product(), c),
    }
}

/// Helper for implementations: validate a `rows_f32` request, returning the row count.
pub(crate) fn check_rows_request(
    file: &Path,
    name: &str,
    shape: &[usize],
    first: usize,
    out_len: usize,
) -> Result<usize> {
    let (rows, cols) = rows_cols(shape);
    if cols == 0 || !out_len.is_multiple_of(cols) {
        return Err(tensor_err(
            file,
            name,
            format!("output length {out_len} is not a multiple of the row length {cols}"),
        ));
    }
    let n = out_len / cols;
    if first.checked_add(n).is_none_or(|end| end > rows) {
        return Err(tensor_err(
            file,
            name,
            format!(
                "rows {first}..{} requested, tensor has {rows}",
                first.saturating_add(n)
            ),
        ));
    }
    Ok(n)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Seeded codebooks, banded indices and f16 row scales of a VQ matrix (CONTAINER.md §4.2).
    pub(crate) struct Bank {
        pub packed: bool,
        pub stages: usize,
        pub entries: usize,
        pub rows: usize,
        pub cols: usize,
        pub books: Vec<Vec<f32>>,
        pub indices: Vec<u8>,
        pub scales: Vec<u8>,
    }

    impl Bank {
        pub(crate) fn view(&self) -> VqView<'_> {
            VqView {
                rows: self.rows,
                cols: self.cols,
                packed: self.packed,
                stages: self.stages,
                entries: self.entries,
                books: &self.books,
                indices: &self.indices,
                scales: &self.scales,
            }
        }

        /// Every row's values by the definition ([`reference`]), row-major.
        pub(crate) fn values(&self) -> Vec<f32> {
            let v = self.view();
            (0..self.rows)
                .flat_map(|r| (0..self.cols / VQ_WIDTH).flat_map(move |c| reference(&v, r, c)))
                .collect()
        }
    }

    /// A `rows` × `cols` VQ matrix: VQ4P (four stages of six bits) when `packed`, else VQ3R
    /// (a byte per stage), `entries` per codebook.
    pub(crate) fn bank(
        packed: bool,
        stages: usize,
        entries: usize,
        rows: usize,
        cols: usize,
        seed: u64,
    ) -> Bank {
        let bytes_per_vector = if packed { 3 } else { stages };
        let mut state = seed;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let books = (0..stages)
            .map(|_| {
                (0..entries * VQ_WIDTH)
                    .map(|_| (next() as f32 / u32::MAX as f32 - 0.25) * 3.0)
                    .collect()
            })
            .collect();
        let bands = rows.div_ceil(VQ_ROW_BAND);
        let indices = (0..bands * cols / VQ_WIDTH * VQ_ROW_BAND * bytes_per_vector)
            .map(|_| next() as u8)
            .collect();
        // f16 scales between 1/4 and 4 (exponent 13 ..= 16), random mantissa.
        let scales = (0..rows)
            .flat_map(|_| {
                let h = (((13 + next() % 4) << 10) | (next() % 1024)) as u16;
                h.to_le_bytes()
            })
            .collect();
        Bank {
            packed,
            stages,
            entries,
            rows,
            cols,
            books,
            indices,
            scales,
        }
    }

    /// The definition (CONTAINER.md §4.2), written without the view's helpers: the stage
    /// indices from the bytes, the entries added from 0.0 in stage order, times the f16 scale.
    pub(crate) fn reference(v: &VqView, r: usize, vector: usize) -> [f32; VQ_WIDTH] {
        let bpv = if v.packed { 3 } else { v.stages };
        let at = ((r / 64 * (v.cols / 8) + vector) * 64 + r % 64) * bpv;
        let b = &v.indices[at..at + bpv];
        let sel: Vec<usize> = if v.packed {
            let bits = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
            (0..4).map(|i| (bits >> (6 * i) & 63) as usize).collect()
        } else {
            b.iter().map(|&x| usize::from(x)).collect()
        };
        let scale = half::f16::from_le_bytes([v.scales[2 * r], v.scales[2 * r + 1]]).to_f32();
        std::array::from_fn(|t| {
            let mut acc = 0.0f32;
            for (book, &ix) in v.books.iter().zip(&sel) {
                acc += book[ix * VQ_WIDTH + t];
            }
            scale * acc
        })
    }

    /// Every stage count and both index formats, in one band and across two, through the
    /// fixed-size codebook path and the slice path alike.
    #[test]
    fn vq_vectors_equal_the_definition_in_every_format() {
        let rows = 72;
        for (packed, stages, entries) in [
            (true, 4, 64),
            (false, 3, 256),
            (false, 4, 256),
            (false, 2, 256),
            (false, 3, 300),
        ] {
            let b = bank(packed, stages, entries, rows, 32, 7);
            let v = b.view();
            let bits = |x: [f32; VQ_WIDTH]| x.map(f32::to_bits);
            for r in 0..rows {
                for vector in 0..4 {
                    let want = bits(reference(&v, r, vector));
                    assert_eq!(
                        bits(v.vector(r, vector)),
                        want,
                        "{packed} {stages}: {r} {vector}"
                    );
                }
            }
            for r in [0, 8, 56, 60, 64] {
                let mut block = [[0f32; 32]; 8];
                v.vectors(r, 0, &mut block);
                for (i, row) in block.iter().enumerate() {
                    for vector in 0..4 {
                        let got: [f32; VQ_WIDTH] =
                            row[vector * VQ_WIDTH..][..VQ_WIDTH].try_into().unwrap();
                        let want = bits(reference(&v, r + i, vector));
                        assert_eq!(bits(got), want, "{packed} {stages}: rows {r}+{i} {vector}");
                    }
                }
            }
        }
    }
}
