//! Linear layers with the canonical summation of MODEL.md §5.4 (kinds from §4.8).
//!
//! The caller names the kind of a linear (§4.8 decides it from the tensor name); the stored
//! weight stays memory-mapped and is dequantised a few rows at a time as a call needs them.
//!
//! | regime   | kind        | input                    | reduction                | output |
//! |----------|-------------|--------------------------|--------------------------|--------|
//! | upstream | `Fp8`/`Fp4` | bf16 → FP8 act-quant     | C1 block-exact GEMM      | bf16   |
//! | upstream | `Bf16`      | bf16                     | C2 (f64, increasing k)   | bf16   |
//! | upstream | `F32`       | f32                      | C2                       | f32    |
//! | exact    | any         | f32                      | C2                       | f32    |
//!
//! **C1 from dequantised values.** With a power-of-two activation scale `sa` and weight scale
//! `sw` shared by a 32-block, `Σ (qa·sa)(qw·sw) = sa·sw·Σ qa·qw`; every product of two
//! dequantised values is exact in f64 and so is the block sum (a multiple of `sa·sw·2^−18`
//! below `sa·sw·2^23`), whatever the order. Rounding that f64 sum to f32 therefore equals
//! §5.4's `f32(P_kb)·sa·sw` whenever the product is an f32 normal, i.e. for any weight scale
//! above 2^−86 (real scales are near 2^−10). The kernel thus reads exact dequantised rows and
//! sums each block exactly in f64 lanes, then accumulates the block results in f32 in
//! increasing block order. On a container checkpoint (Q4G/Q8G/VQ3R weights) the same rule is
//! applied to the container's dequantised values; it is then a well-defined canonical order
//! rather than an exact product sum.
//!
//! Every output element is one fixed sequential reduction over k, computed by one task, so the
//! result of a row does not depend on how many rows a call carries nor on the thread count.

use std::cell::Cell;
use std::sync::Arc;

use rayon::prelude::*;

use super::numerics::Numerics;
use super::quant::{act_quant_fp8_inplace, bf16, round_bf16, BLOCK};
use crate::checkpoint::{Checkpoint, Layout, Storage};
use crate::{Error, Result};

/// How the reference multiplies by a weight (MODEL.md §4.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearKind {
    /// FP8 weight, FP8 activation GEMM.
    Fp8,
    /// FP4 routed-expert weight, FP8 activation GEMM.
    Fp4,
    /// bf16 `F.linear` / einsum with f32 accumulation.
    Bf16,
    /// f32 `F.linear`.
    F32,
}

impl LinearKind {
    /// Release storages that the kind may be read from. `Bf16` accepts an FP8 weight because
    /// `wo_a` is dequantised to bf16 at load (§4.7, exact); `F32` accepts bf16/f16 weights
    /// promoted at load (§4.7 item 6).
    fn accepts_release(self, storage: Storage) -> bool {
        match self {
            LinearKind::Fp8 => storage == Storage::Fp8Block,
            LinearKind::Fp4 => storage == Storage::Fp4,
            LinearKind::Bf16 => matches!(storage, Storage::Bf16 | Storage::Fp8Block),
            LinearKind::F32 => matches!(storage, Storage::F32 | Storage::Bf16 | Storage::F16),
        }
    }

    fn block_exact(self) -> bool {
        matches!(self, LinearKind::Fp8 | LinearKind::Fp4)
    }
}

/// Output rows a task handles (one dequantised chunk of weight rows).
const ROWS_PER_TASK: usize = 16;

/// A memory-mapped weight `[out_features, in_features]` with the canonical product `y = x Wᵀ`.
pub struct Linear {
    ckpt: Arc<dyn Checkpoint>,
    name: String,
    kind: LinearKind,
    storage: Storage,
    out_features: usize,
    in_features: usize,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("storage", &self.storage)
            .field("out_features", &self.out_features)
            .field("in_features", &self.in_features)
            .finish()
    }
}

impl Linear {
    /// Bind tensor `name` of `ckpt` as a linear of the given kind. Checks that it is a 2-D
    /// matrix, that its storage fits the kind (release layout; a container's requantised
    /// storages are accepted for every kind) and, for the FP8/FP4 kinds, that the input width
    /// is a whole number of 32-blocks. Errors name the tensor.
    pub fn load(ckpt: &Arc<dyn Checkpoint>, name: &str, kind: LinearKind) -> Result<Linear> {
        let bad = |reason: String| Error::Tensor {
            file: std::path::PathBuf::from(format!("<{:?} checkpoint>", ckpt.layout())),
            tensor: name.to_string(),
            reason,
        };
        if !ckpt.contains(name) {
            return Err(bad("missing (needed as a linear weight)".into()));
        }
        let shape = ckpt.shape(name)?;
        let storage = ckpt.storage(name)?;
        let [out_features, in_features] = shape[..] else {
            return Err(bad(format!(
                "a linear weight must be 2-D [out, in], found shape {shape:?}"
            )));
        };
        if out_features == 0 || in_features == 0 {
            return Err(bad(format!("empty linear weight {shape:?}")));
        }
        match ckpt.layout() {
            Layout::Release if !kind.accepts_release(storage) => {
                return Err(bad(format!(
                    "stored as {storage:?}, which a {kind:?} linear cannot read (MODEL.md §4.8)"
                )));
            }
            _ if storage == Storage::EngramRows => {
                return Err(bad("Engram row storage is not a linear weight".into()));
            }
            _ => {}
        }
        if kind.block_exact() && in_features % BLOCK != 0 && ckpt.layout() == Layout::Release {
            return Err(bad(format!(
                "{kind:?} linear needs in_features % 32 == 0, found {in_features}"
            )));
        }
        Ok(Linear {
            ckpt: Arc::clone(ckpt),
            name: name.to_string(),
            kind,
            storage,
            out_features,
            in_features,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn kind(&self) -> LinearKind {
        self.kind
    }
    pub fn storage(&self) -> Storage {
        self.storage
    }
    pub fn out_features(&self) -> usize {
        self.out_features
    }
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// `y[m, :] = x[m, :] Wᵀ` for `rows` input rows, with the regime's rounding and summation.
    /// `x` is `[rows, in_features]`, `y` is `[rows, out_features]`, both row-major.
    pub fn forward(&self, x: &[f32], rows: usize, y: &mut [f32], numerics: Numerics) -> Result<()> {
        let (n_in, n_out) = (self.in_features, self.out_features);
        if x.len() != rows * n_in || y.len() != rows * n_out {
            return Err(Error::Model(format!(
                "linear `{}` [{n_out}, {n_in}]: input has {} values and output {} for {rows} rows",
                self.name,
                x.len(),
                y.len()
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let upstream = numerics.is_upstream();
        let block_exact = upstream && self.kind.block_exact();
        if block_exact && n_in % BLOCK != 0 {
            return Err(Error::Model(format!(
                "linear `{}`: FP8 activation quantisation needs in_features % 32 == 0, found {n_in}",
                self.name
            )));
        }
        let round_out = upstream && self.kind != LinearKind::F32;

        // The GEMM input: bf16, then act-quant for FP8/FP4 (upstream); f32 as given otherwise.
        let mut xin_buf = take_scratch(&INPUT_SCRATCH, 0);
        let xin: &[f32] = if upstream && self.kind != LinearKind::F32 {
            xin_buf.extend_from_slice(x);
            round_bf16(&mut xin_buf);
            if block_exact {
                for row in xin_buf.chunks_exact_mut(n_in) {
                    act_quant_fp8_inplace(row);
                }
            }
            &xin_buf
        } else {
            x
        };

        let kernel = Kernel {
            linear: self,
            xin,
            rows,
            block_exact,
            round_out,
        };
        let result = if rows == 1 {
            // Decode: each task owns a contiguous slice of y.
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .try_for_each(|(t, ych)| kernel.task(t * ROWS_PER_TASK, ych))
        } else {
            // Prefill: tasks fill an output-major buffer, transposed into y afterwards.
            let mut yt = take_scratch(&OUTPUT_SCRATCH, rows * n_out);
            let r = yt
                .par_chunks_mut(ROWS_PER_TASK * rows)
                .enumerate()
                .try_for_each(|(t, ych)| kernel.task(t * ROWS_PER_TASK, ych));
            if r.is_ok() {
                for (n, col) in yt.chunks_exact(rows).enumerate() {
                    for (m, &v) in col.iter().enumerate() {
                        y[m * n_out + n] = v;
                    }
                }
            }
            put_scratch(&OUTPUT_SCRATCH, yt);
            r
        };
        put_scratch(&INPUT_SCRATCH, xin_buf);
        result
    }
}

/// One call's fixed parameters, shared by its tasks.
struct Kernel<'a> {
    linear: &'a Linear,
    xin: &'a [f32],
    rows: usize,
    block_exact: bool,
    round_out: bool,
}

impl Kernel<'_> {
    /// Compute outputs `first..first + n` (n = out.len() / rows) for every input row into `out`,
    /// laid out output-major (`out[(n - first) * rows + m]`).
    fn task(&self, first: usize, out: &mut [f32]) -> Result<()> {
        let n_in = self.linear.in_features;
        let n_rows_w = out.len() / self.rows;
        let mut w = take_scratch(&WEIGHT_SCRATCH, n_rows_w * n_in);
        let r = self
            .linear
            .ckpt
            .rows_f32(&self.linear.name, first, &mut w[..n_rows_w * n_in]);
        if r.is_ok() {
            // Tiles of several independent reductions keep the FPU pipelines busy; every
            // output is still its own sequential chain, so tiling never changes a bit.
            let mut i = 0;
            while i < n_rows_w {
                if self.rows == 1 {
                    if n_rows_w - i >= 8 {
                        self.tile::<8, 1>(&w, i, 0, out);
                        i += 8;
                    } else {
                        self.tile::<1, 1>(&w, i, 0, out);
                        i += 1;
                    }
                    continue;
                }
                let four = n_rows_w - i >= 4;
                let mut m = 0;
                while m < self.rows {
                    let pair = self.rows - m >= 2;
                    match (four, pair) {
                        (true, true) => self.tile::<4, 2>(&w, i, m, out),
                        (true, false) => self.tile::<4, 1>(&w, i, m, out),
                        (false, true) => self.tile::<1, 2>(&w, i, m, out),
                        (false, false) => self.tile::<1, 1>(&w, i, m, out),
                    }
                    m += if pair { 2 } else { 1 };
                }
                i += if four { 4 } else { 1 };
            }
        }
        put_scratch(&WEIGHT_SCRATCH, w);
        r
    }

    /// Outputs for weight rows `i0..i0+NW` of the task's chunk and input rows `m0..m0+NX`.
    fn tile<const NW: usize, const NX: usize>(
        &self,
        w: &[f32],
        i0: usize,
        m0: usize,
        out: &mut [f32],
    ) {
        let n = self.linear.in_features;
        let wr: [&[f32]; NW] = std::array::from_fn(|i| &w[(i0 + i) * n..(i0 + i + 1) * n]);
        let xr: [&[f32]; NX] = std::array::from_fn(|m| &self.xin[(m0 + m) * n..(m0 + m + 1) * n]);
        let vals = if self.block_exact {
            c1_tile(&xr, &wr)
        } else {
            c2_tile(&xr, &wr)
        };
        for (i, row) in vals.iter().enumerate() {
            for (m, &v) in row.iter().enumerate() {
                out[(i0 + i) * self.rows + m0 + m] = if self.round_out { bf16(v) } else { v };
            }
        }
    }
}

/// C2 (MODEL.md §5.4) for a tile: `out[i][m] = f32(Σ_k x[m][k]·w[i][k])`, each an f64 chain
/// in increasing k (the f32·f32 products are exact in f64).
#[inline(always)]
fn c2_tile<const NW: usize, const NX: usize>(
    x: &[&[f32]; NX],
    w: &[&[f32]; NW],
) -> [[f32; NX]; NW] {
    let len = w[0].len();
    let x = x.map(|r| &r[..len]);
    let w = w.map(|r| &r[..len]);
    let mut acc = [[0f64; NX]; NW];
    for k in 0..len {
        for i in 0..NW {
            let wk = f64::from(w[i][k]);
            for m in 0..NX {
                acc[i][m] += f64::from(x[m][k]) * wk;
            }
        }
    }
    acc.map(|row| row.map(|v| v as f32))
}

/// C1 (MODEL.md §5.4) for a tile, on dequantised values: each 32-block summed in f64 (exact
/// whatever the order, see the module note), rounded once to f32, blocks accumulated in f32
/// in increasing order. The final bf16 rounding is the caller's.
#[inline(always)]
fn c1_tile<const NW: usize, const NX: usize>(
    x: &[&[f32]; NX],
    w: &[&[f32]; NW],
) -> [[f32; NX]; NW] {
    let len = w[0].len();
    let x = x.map(|r| &r[..len]);
    let w = w.map(|r| &r[..len]);
    let mut acc = [[0f32; NX]; NW];
    for k0 in (0..len).step_by(BLOCK) {
        let mut block = [[0f64; NX]; NW];
        for k in k0..k0 + BLOCK {
            for i in 0..NW {
                let wk = f64::from(w[i][k]);
                for m in 0..NX {
                    block[i][m] += f64::from(x[m][k]) * wk;
                }
            }
        }
        for i in 0..NW {
            for m in 0..NX {
                acc[i][m] += block[i][m] as f32;
            }
        }
    }
    acc
}

/// C1 for one dot product (see [`c1_tile`]); `x.len()` must be a multiple of 32.
pub fn block_exact_dot(x: &[f32], w: &[f32]) -> f32 {
    debug_assert_eq!(x.len() % BLOCK, 0);
    c1_tile(&[x], &[w])[0][0]
}

// Per-thread reusable buffers. They are taken out of the cell while in use, so a nested call
// (a linear inside a rayon task of another linear) finds an empty buffer instead of aliasing.
thread_local! {
    static INPUT_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static OUTPUT_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static WEIGHT_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

type Scratch = std::thread::LocalKey<Cell<Vec<f32>>>;

/// Take this thread's buffer, cleared, then zero-filled to `len`.
fn take_scratch(key: &'static Scratch, len: usize) -> Vec<f32> {
    let mut v = key.with(Cell::take);
    v.clear();
    v.resize(len, 0.0);
    v
}

/// Return a buffer (keeping the larger of the returned and any buffer stored meanwhile).
fn put_scratch(key: &'static Scratch, v: Vec<f32>) {
    key.with(|c| {
        let old = c.take();
        c.set(if old.capacity() > v.capacity() {
            old
        } else {
            v
        });
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Config;
    use crate::model::numerics::dot_f64_wide;
    use crate::model::quant::{act_quant_fp8, E2M1_GRID};
    use std::collections::HashMap;

    /// An in-memory checkpoint of exact f32 rows with a declared storage (test double).
    pub(crate) struct MemCheckpoint {
        pub layout: Layout,
        pub tensors: HashMap<String, (Vec<usize>, Storage, Vec<f32>)>,
    }

    impl Checkpoint for MemCheckpoint {
        fn layout(&self) -> Layout {
            self.layout
        }
        fn config(&self) -> &Config {
            unreachable!("the kernel tests never read a config")
        }
        fn contains(&self, name: &str) -> bool {
            self.tensors.contains_key(name)
        }
        fn shape(&self, name: &str) -> Result<Vec<usize>> {
            Ok(self.get(name)?.0.clone())
        }
        fn storage(&self, name: &str) -> Result<Storage> {
            Ok(self.get(name)?.1)
        }
        fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
            Ok(self.get(name)?.2.clone())
        }
        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = self.tensors.keys().cloned().collect();
            v.sort();
            v
        }
        fn quant_view(&self, _: &str) -> Result<Option<crate::checkpoint::QuantView<'_>>> {
            Ok(None)
        }
        fn engram_constants(&self) -> Result<crate::config::EngramHashConstants> {
            Err(Error::Model("the kernel test double has no Engram".into()))
        }
        fn engram_token_map(&self) -> Result<Option<Vec<i32>>> {
            Ok(None)
        }
        fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> Result<()> {
            let (shape, _, data) = self.get(name)?;
            let cols = shape[1];
            let start = first * cols;
            let src = data
                .get(start..start + out.len())
                .ok_or_else(|| Error::Model(format!("rows {first}.. of `{name}` out of range")))?;
            out.copy_from_slice(src);
            Ok(())
        }
    }

    impl MemCheckpoint {
        fn get(&self, name: &str) -> Result<&(Vec<usize>, Storage, Vec<f32>)> {
            self.tensors.get(name).ok_or_else(|| Error::Tensor {
                file: "<mem>".into(),
                tensor: name.into(),
                reason: "missing".into(),
            })
        }
    }

    /// Deterministic pseudo-random source (PCG-style LCG).
    pub(crate) struct Rng(u64);
    impl Rng {
        pub fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub fn next_u32(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        /// Uniform in [-1, 1).
        pub fn uniform(&mut self) -> f32 {
            (self.next_u32() as f64 / (1u64 << 31) as f64 - 1.0) as f32
        }
    }

    fn e4m3_value(code: u8) -> f32 {
        // MODEL.md §4.5, as an independent test oracle.
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((code >> 3) & 0xF);
        let m = f32::from(code & 7);
        sign * if e == 0 {
            m / 8.0 * 2f32.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f32.powi(e - 7)
        }
    }

    /// A random FP8 weight: codes, 32x32 block scale exponents, and its exact dequantisation.
    struct Fp8Weight {
        codes: Vec<u8>,
        scale_exp: Vec<i32>, // [ceil(out/32), in/32], value 2^exp
        values: Vec<f32>,
    }

    fn random_fp8(out: usize, inp: usize, rng: &mut Rng) -> Fp8Weight {
        let codes: Vec<u8> = (0..out * inp)
            .map(|_| loop {
                let c = rng.next_u32() as u8;
                if c & 0x7F != 0x7F {
                    break c;
                }
            })
            .collect();
        let (bo, bi) = (out.div_ceil(32), inp / 32);
        let scale_exp: Vec<i32> = (0..bo * bi)
            .map(|_| -((rng.next_u32() % 12) as i32) - 4)
            .collect();
        let values = (0..out * inp)
            .map(|i| {
                let (n, k) = (i / inp, i % inp);
                e4m3_value(codes[i]) * 2f32.powi(scale_exp[(n / 32) * bi + k / 32])
            })
            .collect();
        Fp8Weight {
            codes,
            scale_exp,
            values,
        }
    }

    /// A random FP4 weight: nibble codes [out, in], per-row-per-32 scale exponents, values.
    struct Fp4Weight {
        codes: Vec<u8>,
        scale_exp: Vec<i32>, // [out, in/32]
        values: Vec<f32>,
    }

    fn random_fp4(out: usize, inp: usize, rng: &mut Rng) -> Fp4Weight {
        let codes: Vec<u8> = (0..out * inp)
            .map(|_| (rng.next_u32() & 15) as u8)
            .collect();
        let bi = inp / 32;
        let scale_exp: Vec<i32> = (0..out * bi)
            .map(|_| -((rng.next_u32() % 10) as i32) - 2)
            .collect();
        let values = (0..out * inp)
            .map(|i| {
                let (n, k) = (i / inp, i % inp);
                let c = codes[i];
                let v = E2M1_GRID[usize::from(c & 7)] * if c & 8 != 0 { -1.0 } else { 1.0 };
                v * 2f32.powi(scale_exp[n * bi + k / 32])
            })
            .collect();
        Fp4Weight {
            codes,
            scale_exp,
            values,
        }
    }

    /// MODEL.md §5.4 C1 computed literally from integer codes: per block an exact integer sum,
    /// rounded once to f32, times both scales, accumulated in f32; the total rounded to bf16.
    /// `w_int(n, k)` is the weight code as an integer multiple of 2^-w_shift; `w_scale(n, kb)`.
    fn c1_reference(
        x: &[f32],
        out: usize,
        inp: usize,
        w_int: impl Fn(usize, usize) -> i64,
        w_shift: i32,
        w_scale: impl Fn(usize, usize) -> f32,
    ) -> Vec<f32> {
        let rows = x.len() / inp;
        let mut y = vec![0f32; rows * out];
        for m in 0..rows {
            let xr: Vec<f32> = x[m * inp..(m + 1) * inp].iter().map(|&v| bf16(v)).collect();
            let (qa, sa) = act_quant_fp8(&xr);
            for n in 0..out {
                let mut acc = 0f32;
                for kb in 0..inp / 32 {
                    let mut p: i64 = 0;
                    for k in kb * 32..kb * 32 + 32 {
                        let a_int = (e4m3_value(qa[k]) * 512.0) as i64; // exact: multiple of 2^-9
                        p += a_int * w_int(n, k);
                    }
                    let p_f32 = (p as f64 * 2f64.powi(-9 - w_shift)) as f32;
                    acc += p_f32 * sa[kb] * w_scale(n, kb);
                }
                y[m * out + n] = bf16(acc);
            }
        }
        y
    }

    fn mem(tensors: Vec<(&str, Vec<usize>, Storage, Vec<f32>)>) -> Arc<dyn Checkpoint> {
        Arc::new(MemCheckpoint {
            layout: Layout::Release,
            tensors: tensors
                .into_iter()
                .map(|(n, s, st, d)| (n.to_string(), (s, st, d)))
                .collect(),
        })
    }

    fn random_x(rows: usize, inp: usize, rng: &mut Rng) -> Vec<f32> {
        (0..rows * inp)
            .map(|i| rng.uniform() * 2f32.powi((i % 5) as i32 * 2 - 3))
            .collect()
    }

    #[test]
    fn fp8_upstream_is_c1_on_codes() {
        let mut rng = Rng::new(1);
        let (out, inp, rows) = (70, 256, 3); // out not a multiple of 32 or of the task size
        let w = random_fp8(out, inp, &mut rng);
        let ckpt = mem(vec![(
            "w",
            vec![out, inp],
            Storage::Fp8Block,
            w.values.clone(),
        )]);
        let lin = Linear::load(&ckpt, "w", LinearKind::Fp8).unwrap();
        let x = random_x(rows, inp, &mut rng);
        let mut y = vec![0f32; rows * out];
        lin.forward(&x, rows, &mut y, Numerics::Upstream).unwrap();
        let want = c1_reference(
            &x,
            out,
            inp,
            |n, k| (e4m3_value(w.codes[n * inp + k]) * 512.0) as i64,
            9,
            |n, kb| 2f32.powi(w.scale_exp[(n / 32) * (inp / 32) + kb]),
        );
        assert_eq!(y, want);
        // And close to the exact f64 product of the quantised operands (bf16-level error).
        for m in 0..rows {
            let mut xq: Vec<f32> = x[m * inp..(m + 1) * inp].iter().map(|&v| bf16(v)).collect();
            act_quant_fp8_inplace(&mut xq);
            for n in 0..out {
                let exact = dot_f64_wide(&xq, &w.values[n * inp..(n + 1) * inp]);
                let got = f64::from(y[m * out + n]);
                assert!(
                    (got - exact).abs() <= exact.abs() * 2f64.powi(-8) + 1e-30,
                    "{got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn fp4_upstream_is_c1_on_codes() {
        let mut rng = Rng::new(2);
        let (out, inp, rows) = (33, 128, 4);
        let w = random_fp4(out, inp, &mut rng);
        let ckpt = mem(vec![("e", vec![out, inp], Storage::Fp4, w.values.clone())]);
        let lin = Linear::load(&ckpt, "e", LinearKind::Fp4).unwrap();
        let x = random_x(rows, inp, &mut rng);
        let mut y = vec![0f32; rows * out];
        lin.forward(&x, rows, &mut y, Numerics::Upstream).unwrap();
        let want = c1_reference(
            &x,
            out,
            inp,
            |n, k| {
                let c = w.codes[n * inp + k];
                let v = (E2M1_GRID[usize::from(c & 7)] * 2.0) as i64;
                if c & 8 != 0 {
                    -v
                } else {
                    v
                }
            },
            1,
            |n, kb| 2f32.powi(w.scale_exp[n * (inp / 32) + kb]),
        );
        assert_eq!(y, want);
    }

    #[test]
    fn c1_sums_a_block_exactly_and_blocks_in_f32() {
        // Block 0 of row A sums 2^16 + 2^-18 - 2^16 (in units of sa·sw = 2^-16): exact = 2^-34,
        // any f32 summation inside the block loses it. Row B has block sums 1, 2^-30, -1:
        // f32 accumulation across blocks gives 0, f64 accumulation would give 2^-30.
        let inp = 96;
        let mut x = vec![0f32; inp];
        (x[0], x[1], x[2], x[32], x[64]) = (1.0, 2f32.powi(-17), -1.0, 1.0, 1.0);
        let mut w = vec![0f32; 2 * inp];
        (w[0], w[1], w[2]) = (1.0, 2f32.powi(-17), 1.0);
        (w[inp], w[inp + 32], w[inp + 64]) = (1.0, 2f32.powi(-30), -1.0);
        let ckpt = mem(vec![("w", vec![2, inp], Storage::Fp8Block, w)]);
        let lin = Linear::load(&ckpt, "w", LinearKind::Fp8).unwrap();
        let mut y = [0f32; 2];
        lin.forward(&x, 1, &mut y, Numerics::Upstream).unwrap();
        assert_eq!(y, [2f32.powi(-34), 0.0]);
        // C2 is sequential f64 in increasing k: 2^-60 + 1 - 1 = 0 (a reordered sum is not 0).
        let ckpt = mem(vec![("f", vec![1, 3], Storage::F32, vec![1.0; 3])]);
        let lin = Linear::load(&ckpt, "f", LinearKind::F32).unwrap();
        let mut y = [1f32];
        lin.forward(&[2f32.powi(-60), 1.0, -1.0], 1, &mut y, Numerics::Exact)
            .unwrap();
        assert_eq!(y, [0.0]);
    }

    #[test]
    fn exact_and_bf16_and_f32_kinds_follow_c2() {
        let mut rng = Rng::new(3);
        let (out, inp, rows) = (19, 40, 3); // in not a multiple of 32: fine for C2 kinds
        let wv: Vec<f32> = (0..out * inp).map(|_| bf16(rng.uniform())).collect();
        let ckpt = mem(vec![
            ("b", vec![out, inp], Storage::Bf16, wv.clone()),
            ("f", vec![out, inp], Storage::F32, wv.clone()),
        ]);
        let x = random_x(rows, inp, &mut rng);
        let c2 = |xr: &[f32], wr: &[f32]| {
            let mut acc = 0f64;
            for k in 0..xr.len() {
                acc += xr[k] as f64 * wr[k] as f64;
            }
            acc as f32
        };
        for (name, kind) in [("b", LinearKind::Bf16), ("f", LinearKind::F32)] {
            let lin = Linear::load(&ckpt, name, kind).unwrap();
            for numerics in [Numerics::Exact, Numerics::Upstream] {
                let mut y = vec![0f32; rows * out];
                lin.forward(&x, rows, &mut y, numerics).unwrap();
                for m in 0..rows {
                    let xr: Vec<f32> = x[m * inp..(m + 1) * inp]
                        .iter()
                        .map(|&v| {
                            if numerics.is_upstream() && kind == LinearKind::Bf16 {
                                bf16(v)
                            } else {
                                v
                            }
                        })
                        .collect();
                    for n in 0..out {
                        let v = c2(&xr, &wv[n * inp..(n + 1) * inp]);
                        let want = if numerics.is_upstream() && kind == LinearKind::Bf16 {
                            bf16(v)
                        } else {
                            v
                        };
                        assert_eq!(y[m * out + n], want, "{name} {numerics} m{m} n{n}");
                    }
                }
            }
        }
    }

    #[test]
    fn exact_regime_on_fp8_weights_is_c2_on_dequantised_values() {
        let mut rng = Rng::new(4);
        let (out, inp) = (40, 64);
        let w = random_fp8(out, inp, &mut rng);
        let ckpt = mem(vec![(
            "w",
            vec![out, inp],
            Storage::Fp8Block,
            w.values.clone(),
        )]);
        let lin = Linear::load(&ckpt, "w", LinearKind::Fp8).unwrap();
        let x = random_x(1, inp, &mut rng);
        let mut y = vec![0f32; out];
        lin.forward(&x, 1, &mut y, Numerics::Exact).unwrap();
        for n in 0..out {
            assert_eq!(
                y[n],
                dot_f64_wide(&x, &w.values[n * inp..(n + 1) * inp]) as f32
            );
        }
    }

    #[test]
    fn rows_and_thread_count_do_not_change_a_row() {
        let mut rng = Rng::new(5);
        let (out, inp, rows) = (77, 96, 9);
        let w8 = random_fp8(out, inp, &mut rng);
        let w4 = random_fp4(out, inp, &mut rng);
        let ckpt = mem(vec![
            ("w8", vec![out, inp], Storage::Fp8Block, w8.values),
            ("w4", vec![out, inp], Storage::Fp4, w4.values),
        ]);
        let x = random_x(rows, inp, &mut rng);
        for (name, kind) in [
            ("w8", LinearKind::Fp8),
            ("w4", LinearKind::Fp4),
            ("w8", LinearKind::Bf16),
        ] {
            let lin = Linear::load(&ckpt, name, kind).unwrap();
            for numerics in [Numerics::Upstream, Numerics::Exact] {
                let run = |threads: usize, split: bool| {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    pool.install(|| {
                        let mut y = vec![0f32; rows * out];
                        if split {
                            for m in 0..rows {
                                lin.forward(
                                    &x[m * inp..(m + 1) * inp],
                                    1,
                                    &mut y[m * out..(m + 1) * out],
                                    numerics,
                                )
                                .unwrap();
                            }
                        } else {
                            lin.forward(&x, rows, &mut y, numerics).unwrap();
                        }
                        y
                    })
                };
                let base = run(1, false);
                assert_eq!(base, run(2, false), "{name} {kind:?} {numerics}: threads");
                assert_eq!(base, run(1, true), "{name} {kind:?} {numerics}: rows");
                assert_eq!(
                    base,
                    run(2, true),
                    "{name} {kind:?} {numerics}: rows+threads"
                );
            }
        }
    }

    #[test]
    fn bad_weights_and_inputs_are_named_errors() {
        let ckpt = mem(vec![
            ("v", vec![64], Storage::Bf16, vec![0.0; 64]),
            ("b", vec![2, 32], Storage::Bf16, vec![0.0; 64]),
            ("odd", vec![2, 40], Storage::Fp8Block, vec![0.0; 80]),
        ]);
        let err = |r: Result<Linear>| r.unwrap_err().to_string();
        assert!(err(Linear::load(&ckpt, "nope", LinearKind::F32)).contains("`nope`"));
        assert!(err(Linear::load(&ckpt, "v", LinearKind::Bf16)).contains("2-D"));
        assert!(err(Linear::load(&ckpt, "b", LinearKind::Fp8)).contains("Bf16"));
        assert!(err(Linear::load(&ckpt, "odd", LinearKind::Fp8)).contains("% 32"));
        let lin = Linear::load(&ckpt, "b", LinearKind::Bf16).unwrap();
        let mut y = vec![0f32; 2];
        let e = lin
            .forward(&[0.0; 31], 1, &mut y, Numerics::Exact)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`b`"), "{e}");
        // A failing read inside a task surfaces as an error, not a panic.
        let short = mem(vec![("s", vec![40, 32], Storage::F32, vec![0.0; 32])]);
        let lin = Linear::load(&short, "s", LinearKind::F32).unwrap();
        let mut y = vec![0f32; 40];
        assert!(lin.forward(&[0.0; 32], 1, &mut y, Numerics::Exact).is_err());
    }
}

#[cfg(test)]
mod timing {
    use super::tests::*;
    use super::*;

    /// Rough throughput probe at release width (run with `--ignored --nocapture`); not a
    /// benchmark of record (that is `ds41 bench --kernels`).
    #[test]
    #[ignore = "timing probe, run by hand"]
    fn probe_5120() {
        let (out, inp) = (5120, 5120);
        let mut rng = Rng::new(9);
        let w: Vec<f32> = (0..out * inp).map(|_| bf16(rng.uniform())).collect();
        let ckpt: Arc<dyn Checkpoint> = Arc::new(MemCheckpoint {
            layout: Layout::Release,
            tensors: [("w".to_string(), (vec![out, inp], Storage::Fp8Block, w))].into(),
        });
        let x: Vec<f32> = (0..16 * inp).map(|_| rng.uniform()).collect();
        for kind in [LinearKind::Fp8, LinearKind::Bf16] {
            let lin = Linear::load(&ckpt, "w", kind).unwrap();
            for numerics in [Numerics::Upstream, Numerics::Exact] {
                for rows in [1usize, 16] {
                    let mut y = vec![0f32; rows * out];
                    let t = std::time::Instant::now();
                    let reps = 3;
                    for _ in 0..reps {
                        lin.forward(&x[..rows * inp], rows, &mut y, numerics)
                            .unwrap();
                    }
                    let dt = t.elapsed().as_secs_f64() / reps as f64;
                    eprintln!(
                        "{kind:?} {numerics} rows={rows}: {:.1} ms/call, {:.2} GMAC/s",
                        dt * 1e3,
                        (rows * out * inp) as f64 / dt / 1e9
                    );
                }
            }
        }
    }
}
