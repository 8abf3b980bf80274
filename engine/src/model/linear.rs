//! Linear layers with the canonical summation of MODEL.md §5.4 (kinds from §4.8).
//!
//! The caller names the kind of a linear (§4.8 decides it from the tensor name); the stored
//! weight stays memory-mapped and the kernels of [`super::matvec`] decode it straight from the
//! mapped bytes (release FP8/FP4/bf16/f16/f32, container Q8G/Q4G; a container's VQ experts are
//! read a task's rows at a time), never as a per-call f32 copy.
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
//! above 2^−86 (real scales are near 2^−10). The kernels thus sum each block exactly in f64
//! (in any order, with the weight scale applied to the block sum), round it to f32, and
//! accumulate the block results in f32 in increasing block order. On a container checkpoint
//! (Q4G/Q8G/VQ3R weights) the same rule is applied to the container's dequantised values in
//! increasing k; it is then a well-defined canonical order rather than an exact product sum.
//!
//! Every output element is one fixed sequential reduction over k, computed by one task, so the
//! result of a row does not depend on how many rows a call carries nor on the thread count.

use std::sync::Arc;

use super::matvec::{self, MatVec, Rule, Source};
use super::numerics::Numerics;
use super::parallel::{for_each_chunk, worth_parallel};
use super::quant::{act_quant_fp8_inplace, round_bf16, BLOCK};
use crate::checkpoint::{Checkpoint, Layout, Storage};
use crate::{Error, Result};

/// The GEMM input's preparation per value (bf16 rounding, act-quant, widening) in
/// multiply-adds' worth, for [`worth_parallel`].
const INPUT_TRANSFORM_COST: usize = 8;

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
        // The GEMM input: bf16, then act-quant for FP8/FP4 (upstream); f32 as given otherwise.
        // Row by row, on the pool for a prefill at real widths (serial, it left the other
        // thread idle for ~2% of a `wide` prefill).
        let transform = upstream && self.kind != LinearKind::F32;
        let mut wide = matvec::take(&matvec::WIDE_SCRATCH, rows * n_in, 0.0);
        let parallel = rows > 1 && worth_parallel(x.len() * INPUT_TRANSFORM_COST);
        for_each_chunk(&mut wide, n_in, parallel, |m, out| {
            let row = &x[m * n_in..(m + 1) * n_in];
            if transform {
                let mut xin = matvec::take(&matvec::INPUT_SCRATCH, 0, 0.0);
                xin.extend_from_slice(row);
                round_bf16(&mut xin);
                if block_exact {
                    act_quant_fp8_inplace(&mut xin);
                }
                for (o, &v) in out.iter_mut().zip(&xin) {
                    *o = f64::from(v);
                }
                matvec::put(&matvec::INPUT_SCRATCH, xin);
            } else {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = f64::from(v);
                }
            }
        });
        let result = self.source().and_then(|source| {
            MatVec {
                source,
                n_in,
                w_first: 0,
                x: &wide,
                x_stride: n_in,
                x_off: 0,
                rows,
                rule: if block_exact {
                    Rule::C1
                } else {
                    Rule::C2 { init: 0.0 }
                },
                round_out: transform,
                x_blocks: None,
                x_by_block: None,
                x_ints: None,
                x_avx2: None,
            }
            .run(n_out, y, n_out, 0)
        });
        matvec::put(&matvec::WIDE_SCRATCH, wide);
        result
    }

    /// The grouped product of `wo_a` (MODEL.md §6.4.7): weight rows `g·(out/G) ..` read
    /// input columns `g·in .. (g+1)·in` of `x` `[rows, groups · in]`. C2 from −0.0 (the
    /// reference's f64 `sum`), input as given, output rounded at the regime's bf16 point.
    pub fn forward_grouped(
        &self,
        x: &[f32],
        rows: usize,
        groups: usize,
        y: &mut [f32],
        numerics: Numerics,
    ) -> Result<()> {
        let (n_in, n_out) = (self.in_features, self.out_features);
        if groups == 0
            || n_out % groups != 0
            || x.len() != rows * groups * n_in
            || y.len() != rows * n_out
        {
            return Err(Error::Model(format!(
                "grouped linear `{}` [{n_out}, {n_in}] in {groups} groups: input has {} values \
                 and output {} for {rows} rows",
                self.name,
                x.len(),
                y.len()
            )));
        }
        let per_group = n_out / groups;
        let mut wide = matvec::take(&matvec::WIDE_SCRATCH, 0, 0.0);
        wide.extend(x.iter().map(|&v| f64::from(v)));
        let result = self.source().and_then(|source| {
            let mut kernel = MatVec {
                source,
                n_in,
                w_first: 0,
                x: &wide,
                x_stride: groups * n_in,
                x_off: 0,
                rows,
                rule: Rule::C2 { init: -0.0 },
                round_out: numerics.is_upstream(),
                x_blocks: None,
                x_by_block: None,
                x_ints: None,
                x_avx2: None,
            };
            (0..groups).try_for_each(|g| {
                kernel.w_first = g * per_group;
                kernel.x_off = g * n_in;
                kernel.run(per_group, y, n_out, g * per_group)
            })
        });
        matvec::put(&matvec::WIDE_SCRATCH, wide);
        result
    }

    /// The stored bytes when the checkpoint has a view of them, else row reads.
    fn source(&self) -> Result<Source<'_>> {
        let view = self.ckpt.weight_view(&self.name)?;
        match view {
            Some(v) => {
                let bad = |reason: String| Error::Tensor {
                    file: std::path::PathBuf::from(format!(
                        "<{:?} checkpoint>",
                        self.ckpt.layout()
                    )),
                    tensor: self.name.clone(),
                    reason,
                };
                if v.shape() != (self.out_features, self.in_features) {
                    return Err(bad(format!(
                        "stored view has shape {:?}, the linear is [{}, {}]",
                        v.shape(),
                        self.out_features,
                        self.in_features
                    )));
                }
                v.check().map_err(bad)?;
                Ok(Source::View(v))
            }
            None => Ok(Source::Rows {
                ckpt: self.ckpt.as_ref(),
                name: &self.name,
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index loops mirror the formulas
pub(crate) mod tests {
    use super::*;
    use crate::config::Config;
    use crate::model::numerics::dot_f64_wide;
    use crate::model::quant::{act_quant_fp8, bf16, E2M1_GRID};
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
        /// Uniform in [-1, 1) (`next_u32` has 31 random bits).
        pub fn uniform(&mut self) -> f32 {
            (self.next_u32() as f64 / (1u64 << 30) as f64 - 1.0) as f32
        }
        /// A draw from `0..n`.
        pub fn below(&mut self, n: usize) -> usize {
            ((u64::from(self.next_u32()) * n as u64) >> 32) as usize
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

    impl Fp4Weight {
        /// The codes as stored: two per byte, low nibble first.
        fn packed(&self) -> Vec<u8> {
            self.codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect()
        }
    }

    /// The e2m1 value of a nibble (bit 3 the sign).
    fn e2m1_value(c: u8) -> f32 {
        E2M1_GRID[usize::from(c & 7)] * if c & 8 != 0 { -1.0 } else { 1.0 }
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
                e2m1_value(codes[i]) * 2f32.powi(scale_exp[n * bi + k / 32])
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

    /// Values (bf16 already) as stored little-endian bf16 bytes.
    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect()
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

    /// A decode product on a few long stored rows (mHC's shape: 24 rows, over a mebibyte of
    /// f32 or bf16) goes to the pool in eight-row tasks: at every vector level, on one thread
    /// or two, the bits of the portable rows path.
    #[test]
    fn few_long_rows_shared_between_threads_keep_their_bits() {
        use super::super::parallel::MIN_PARALLEL_WORK;
        use super::super::simd::{self, Level};
        use crate::checkpoint::DenseDtype;
        let mut rng = Rng::new(13);
        let out = 24;
        for (dtype, storage, kind, inp) in [
            (DenseDtype::F32, Storage::F32, LinearKind::F32, 11_008),
            (DenseDtype::Bf16, Storage::Bf16, LinearKind::Bf16, 22_016),
        ] {
            // Over a mebibyte of weights, below a million multiply-adds.
            assert!(
                out * inp < MIN_PARALLEL_WORK && out * inp * dtype.width() >= MIN_PARALLEL_WORK
            );
            let values: Vec<f32> = (0..out * inp).map(|_| bf16(rng.uniform())).collect();
            let bytes = match dtype {
                DenseDtype::Bf16 => bf16_bytes(&values),
                _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            let (rows_ckpt, view_ckpt) = rows_and_views(
                Layout::Release,
                [("w".to_string(), (vec![out, inp], storage, values))].into(),
                [("w".to_string(), StoredBytes::Dense(dtype, bytes))].into(),
            );
            let by_rows = Linear::load(&rows_ckpt, "w", kind).unwrap();
            let by_view = Linear::load(&view_ckpt, "w", kind).unwrap();
            let x = random_x(1, inp, &mut rng);
            for numerics in [Numerics::Upstream, Numerics::Exact] {
                let want = forward_bits(&by_rows, &x, 1, numerics, (Level::Portable, 1));
                let levels = Level::ALL.into_iter().filter(|&l| l <= simd::available());
                for (level, threads) in levels.flat_map(|l| [(l, 1), (l, 2)]) {
                    let got = forward_bits(&by_view, &x, 1, numerics, (level, threads));
                    let first = (0..out).find(|&i| got[i] != want[i]);
                    assert_eq!(
                        first, None,
                        "{dtype:?} {numerics} {level:?} threads {threads}"
                    );
                }
            }
        }
    }

    /// The same tensors as exact rows (`rows_f32`, the baseline path) and as stored bytes
    /// (`weight_view`).
    fn rows_and_views(
        layout: Layout,
        tensors: HashMap<String, (Vec<usize>, Storage, Vec<f32>)>,
        views: HashMap<String, StoredBytes>,
    ) -> (Arc<dyn Checkpoint>, Arc<dyn Checkpoint>) {
        let rows = MemCheckpoint {
            layout,
            tensors: tensors.clone(),
        };
        let view = ViewCheckpoint {
            rows: MemCheckpoint { layout, tensors },
            views,
        };
        (Arc::new(rows), Arc::new(view))
    }

    /// The output bits of `lin` on `rows` input rows `x`, at vector level `level` on a pool of
    /// `threads` threads.
    fn forward_bits(
        lin: &Linear,
        x: &[f32],
        rows: usize,
        numerics: Numerics,
        (level, threads): (super::super::simd::Level, usize),
    ) -> Vec<u32> {
        use super::super::simd;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut y = vec![0f32; rows * lin.out_features()];
        simd::cap_level(Some(level));
        let r = pool.install(|| lin.forward(x, rows, &mut y, numerics));
        simd::cap_level(None);
        r.unwrap();
        y.iter().map(|v| v.to_bits()).collect()
    }

    /// A test double that serves stored bytes through `weight_view` (and exact rows through
    /// `rows_f32` for the rows path), like the mapped readers.
    struct ViewCheckpoint {
        rows: MemCheckpoint,
        views: HashMap<String, StoredBytes>,
    }

    enum StoredBytes {
        Quant {
            kind: crate::checkpoint::QuantKind,
            codes: Vec<u8>,
            scales: Vec<u8>,
            scale_cols: usize,
        },
        Dense(crate::checkpoint::DenseDtype, Vec<u8>),
        Grouped {
            bits: u8,
            group: usize,
            row_bytes: usize,
            codes: Vec<u8>,
            scales: Vec<u8>,
        },
        Vq(crate::checkpoint::tests::Bank),
    }

    impl Checkpoint for ViewCheckpoint {
        fn layout(&self) -> Layout {
            self.rows.layout()
        }
        fn config(&self) -> &Config {
            self.rows.config()
        }
        fn contains(&self, name: &str) -> bool {
            self.rows.contains(name)
        }
        fn shape(&self, name: &str) -> Result<Vec<usize>> {
            self.rows.shape(name)
        }
        fn storage(&self, name: &str) -> Result<Storage> {
            self.rows.storage(name)
        }
        fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
            self.rows.tensor_f32(name)
        }
        fn rows_f32(&self, _: &str, _: usize, _: &mut [f32]) -> Result<()> {
            Err(Error::Model("the view double serves no rows".into()))
        }
        fn weight_view(&self, name: &str) -> Result<Option<crate::checkpoint::WeightView<'_>>> {
            use crate::checkpoint::{QuantView, WeightView};
            let shape = self.rows.shape(name)?;
            let (rows, cols) = (shape[0], shape[1]);
            Ok(self.views.get(name).map(|b| match b {
                StoredBytes::Quant {
                    kind,
                    codes,
                    scales,
                    scale_cols,
                } => WeightView::Quant(QuantView {
                    kind: *kind,
                    rows,
                    cols,
                    codes,
                    scales,
                    scale_cols: *scale_cols,
                }),
                StoredBytes::Dense(dtype, bytes) => WeightView::Dense {
                    dtype: *dtype,
                    rows,
                    cols,
                    bytes,
                },
                StoredBytes::Grouped {
                    bits,
                    group,
                    row_bytes,
                    codes,
                    scales,
                } => WeightView::Grouped {
                    bits: *bits,
                    rows,
                    cols,
                    group: *group,
                    row_bytes: *row_bytes,
                    codes,
                    scales,
                },
                StoredBytes::Vq(bank) => WeightView::Vq(bank.view()),
            }))
        }
    }

    /// Container-style Q8G / Q4G bytes (f16 group scales) and their exact values.
    fn random_grouped(
        out: usize,
        inp: usize,
        bits: u8,
        group: usize,
        rng: &mut Rng,
    ) -> (StoredBytes, Vec<f32>) {
        let groups = inp.div_ceil(group);
        let padded = groups * group;
        let row_bytes = if bits == 8 { padded } else { padded / 2 };
        let mut codes = vec![0u8; out * row_bytes];
        let mut scales = Vec::new();
        let mut values = vec![0f32; out * inp];
        for r in 0..out {
            let s: Vec<f32> = (0..groups)
                .map(|_| half::f16::from_f32(rng.uniform() * 0.01).to_f32())
                .collect();
            for v in &s {
                scales.extend_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
            }
            for c in 0..inp {
                let q = if bits == 8 {
                    let q = rng.next_u32() as u8;
                    codes[r * row_bytes + c] = q;
                    i32::from(q as i8)
                } else {
                    let n = (rng.next_u32() & 15) as u8;
                    codes[r * row_bytes + c / 2] |= if c % 2 == 0 { n } else { n << 4 };
                    i32::from(n) - 8
                };
                values[r * inp + c] = q as f32 * s[c / group];
            }
        }
        let bytes = StoredBytes::Grouped {
            bits,
            group,
            row_bytes,
            codes,
            scales,
        };
        (bytes, values)
    }

    /// The direct kernels on stored bytes give the same bits as the rows path (exact
    /// dequantised rows) for every storage, rule, row count and thread count.
    #[test]
    fn stored_byte_kernels_match_the_rows_path_bit_for_bit() {
        use super::super::simd::{self, Level};
        use crate::checkpoint::{DenseDtype, QuantKind};
        let mut rng = Rng::new(11);
        // 45 rows: one decode task and a short one; 77: two full 32-row tasks, then 8 + 5;
        // 1031 x 1024: past `WIDE_TASK_WEIGHTS` in matvec, tasks of TILE rows, a short last one.
        for (out, inp) in [(45, 96), (77, 160), (1031, 1024)] {
            let w8 = random_fp8(out, inp, &mut rng);
            let w4 = random_fp4(out, inp, &mut rng);
            let mut wb: Vec<f32> = (0..out * inp).map(|_| bf16(rng.uniform())).collect();
            // A signalling NaN in the bf16 rows (row 2): its value is the quiet NaN that
            // widening makes of it.
            let nan_at = 2 * inp + 5;
            wb[nan_at] = f32::from_bits(0x7FC1_0000);
            let (q8, v8) = random_grouped(out, 40, 8, 16, &mut rng);
            let (q4, v4) = random_grouped(out, 40, 4, 16, &mut rng);
            // Groups of whole 32-column blocks: the AVX-512 kernels read these directly.
            let (q8w, v8w) = random_grouped(out, inp, 8, 64, &mut rng);
            let (q4w, v4w) = random_grouped(out, inp, 4, 32, &mut rng);
            let quant = |kind, codes, e: &[i32]| StoredBytes::Quant {
                kind,
                codes,
                scales: e.iter().map(|&x| (x + 127) as u8).collect(),
                scale_cols: inp / 32,
            };
            let mut tensors = HashMap::new();
            let mut views = HashMap::new();
            let mut add = |name: &str, shape: Vec<usize>, st: Storage, vals: Vec<f32>, b| {
                tensors.insert(name.to_string(), (shape, st, vals));
                views.insert(name.to_string(), b);
            };
            add(
                "fp8",
                vec![out, inp],
                Storage::Fp8Block,
                w8.values.clone(),
                quant(QuantKind::Fp8Block, w8.codes.clone(), &w8.scale_exp),
            );
            add(
                "fp4",
                vec![out, inp],
                Storage::Fp4,
                w4.values.clone(),
                quant(QuantKind::Fp4, w4.packed(), &w4.scale_exp),
            );
            add(
                "bf16",
                vec![out, inp],
                Storage::Bf16,
                wb.clone(),
                StoredBytes::Dense(DenseDtype::Bf16, {
                    let mut bytes = bf16_bytes(&wb);
                    bytes[2 * nan_at..2 * nan_at + 2].copy_from_slice(&0x7F81u16.to_le_bytes());
                    bytes
                }),
            );
            // Rule C2's order made visible: each row's chain passes through ±2^40 at columns
            // a and a + inp/2 (a at random), whose inputs are made equal below, so the terms
            // cancel and any other order changes low bits that the f32 output keeps.
            let cancel: Vec<f32> = (0..out)
                .flat_map(|_| {
                    let a = rng.below(inp / 2);
                    let mut row: Vec<f32> = (0..inp).map(|_| bf16(rng.uniform())).collect();
                    (row[a], row[a + inp / 2]) = (2f32.powi(40), -(2f32.powi(40)));
                    row
                })
                .collect();
            add(
                "cancel",
                vec![out, inp],
                Storage::Bf16,
                cancel.clone(),
                StoredBytes::Dense(DenseDtype::Bf16, bf16_bytes(&cancel)),
            );
            add(
                "f32",
                vec![out, inp],
                Storage::F32,
                wb.iter().map(|v| v * 1.000_1).collect(),
                StoredBytes::Dense(
                    DenseDtype::F32,
                    wb.iter()
                        .flat_map(|v| (v * 1.000_1).to_le_bytes())
                        .collect(),
                ),
            );
            // A block scale past the f32 limit (2^120: the weights from 256 up are infinite
            // in f32, so the block's value is not the scaled block sum), and NaN codes (row 3,
            // column 70; row 37, column 70), take the generic block decode: the vector loops
            // stop there and resume after. Rows 3 and 37 are in the first and the second four
            // of their eight, which the FP8 loop runs one after the other.
            let mut big = random_fp8(out, inp, &mut rng);
            big.scale_exp[1] = 120;
            for n in 0..32 {
                for k in 32..64 {
                    big.values[n * inp + k] = e4m3_value(big.codes[n * inp + k]) * 2f32.powi(120);
                }
            }
            for (row, col) in [(3, 70), (37, 70)] {
                big.codes[row * inp + col] = 0x7F;
                big.values[row * inp + col] = f32::NAN;
            }
            add(
                "fp8big",
                vec![out, inp],
                Storage::Fp8Block,
                big.values.clone(),
                quant(QuantKind::Fp8Block, big.codes.clone(), &big.scale_exp),
            );
            // Likewise an FP4 scale near the limit (row 40, block 1): the 32-row C2 loop stops
            // there (the second task of 77 rows) and resumes after it.
            let mut big4 = random_fp4(out, inp, &mut rng);
            let bi = inp / 32;
            let r = 40.min(out - 1);
            big4.scale_exp[r * bi + 1] = 119;
            for k in 32..64 {
                big4.values[r * inp + k] = e2m1_value(big4.codes[r * inp + k]) * 2f32.powi(119);
            }
            add(
                "fp4big",
                vec![out, inp],
                Storage::Fp4,
                big4.values.clone(),
                quant(QuantKind::Fp4, big4.packed(), &big4.scale_exp),
            );
            // bf16 rows of one full block and a partial one: the 32-row loop, then the
            // block decode for the tail.
            let tail: Vec<f32> = (0..out * 40).map(|_| bf16(rng.uniform())).collect();
            add(
                "bf16tail",
                vec![out, 40],
                Storage::Bf16,
                tail.clone(),
                StoredBytes::Dense(DenseDtype::Bf16, bf16_bytes(&tail)),
            );
            add("q8", vec![out, 40], Storage::Q8G, v8, q8);
            add("q4", vec![out, 40], Storage::Q4G, v4, q4);
            add("q8w", vec![out, inp], Storage::Q8G, v8w, q8w);
            add("q4w", vec![out, inp], Storage::Q4G, v4w, q4w);
            // Groups of two blocks, and an infinite group scale (row 3, group 1): the VNNI
            // nibble loop stops at its first block and resumes after it; the C2 loop takes it.
            let (mut q4inf, mut v4inf) = random_grouped(out, inp, 4, 64, &mut rng);
            if let StoredBytes::Grouped { scales, .. } = &mut q4inf {
                let groups = inp.div_ceil(64);
                scales[2 * (3 * groups + 1)..][..2].copy_from_slice(&0x7C00u16.to_le_bytes());
            }
            for v in &mut v4inf[3 * inp + 64..3 * inp + inp.min(128)] {
                *v *= f32::INFINITY;
            }
            add("q4inf", vec![out, inp], Storage::Q4G, v4inf, q4inf);
            // Container expert rows in each VQ format (VQ3R, VQ4P, four byte stages), held by
            // the row double as their exact values.
            for (name, packed, stages, entries) in [
                ("vq", false, 3, 256),
                ("vq4p", true, 4, 64),
                ("vq4", false, 4, 256),
            ] {
                let vq =
                    crate::checkpoint::tests::bank(packed, stages, entries, out, inp, out as u64);
                add(
                    name,
                    vec![out, inp],
                    Storage::F32,
                    vq.values(),
                    StoredBytes::Vq(vq),
                );
            }
            let (rows_ckpt, view_ckpt) = rows_and_views(Layout::Container, tensors, views);
            let cases = [
                ("fp8", LinearKind::Fp8),
                ("fp8", LinearKind::Bf16),
                ("fp8big", LinearKind::Fp8),
                ("fp8big", LinearKind::F32),
                ("fp4", LinearKind::Fp4),
                ("fp4big", LinearKind::Fp4),
                ("bf16", LinearKind::Bf16),
                ("bf16", LinearKind::F32),
                ("f32", LinearKind::F32),
                ("cancel", LinearKind::Bf16),
                ("cancel", LinearKind::F32),
                ("bf16tail", LinearKind::Bf16),
                ("q8", LinearKind::Bf16),
                ("q4", LinearKind::F32),
                ("q8w", LinearKind::Bf16),
                ("q4w", LinearKind::F32),
                // A container's requantised trunk read by the FP8/FP4 kinds: rule C1 upstream.
                ("q8w", LinearKind::Fp8),
                ("q4w", LinearKind::Fp4),
                ("q4inf", LinearKind::Fp4),
                ("q4inf", LinearKind::F32),
                ("vq", LinearKind::F32),
                // Container experts (rule C1 upstream, on values that are not on a grid), and
                // bf16 / f32 rows read the same way.
                ("vq", LinearKind::Fp4),
                ("vq4p", LinearKind::Fp4),
                ("vq4p", LinearKind::F32),
                ("vq4", LinearKind::Fp4),
                ("bf16", LinearKind::Fp8),
                ("f32", LinearKind::Fp4),
            ];
            for (name, kind) in cases {
                let by_rows = Linear::load(&rows_ckpt, name, kind).unwrap();
                let by_view = Linear::load(&view_ckpt, name, kind).unwrap();
                let n_in = by_rows.in_features();
                for numerics in [Numerics::Upstream, Numerics::Exact] {
                    // Input rows in the groups of module `matvec`: 5 (AVX2: four and one;
                    // AVX-512: one group of five), 9 (AVX2: two fours and one; AVX-512: one
                    // group of nine), 19 (AVX-512: sixteen and three, the second group's
                    // inputs from row 16 of the block-major copy; AVX2: four groups of four
                    // and three single rows).
                    for rows in [1usize, 5, 9, 19] {
                        let mut x = random_x(rows, n_in, &mut rng);
                        if name == "cancel" {
                            for row in x.chunks_exact_mut(n_in) {
                                let (first, second) = row.split_at_mut(n_in / 2);
                                second.copy_from_slice(first);
                            }
                        }
                        // The baseline copy of the row path against every vector copy this
                        // CPU has of the stored-byte path.
                        let want = forward_bits(&by_rows, &x, rows, numerics, (Level::Portable, 1));
                        let levels = Level::ALL.into_iter().filter(|&l| l <= simd::available());
                        for (level, threads) in levels.flat_map(|l| [(l, 1), (l, 2)]) {
                            let got = forward_bits(&by_view, &x, rows, numerics, (level, threads));
                            if got != want {
                                let first_diffs: Vec<_> = (0..got.len())
                                    .filter(|&i| got[i] != want[i])
                                    .map(|i| (i, got[i], want[i]))
                                    .take(4)
                                    .collect();
                                panic!(
                                    "{name} {kind:?} {numerics} rows {rows} {level:?} threads \
                                     {threads}: (output, bits, expected bits) {first_diffs:x?}"
                                );
                            }
                        }
                    }
                }
            }
        }
        // A view that does not cover its shape is a named error, not a panic.
        let short: Arc<dyn Checkpoint> = Arc::new(ViewCheckpoint {
            rows: MemCheckpoint {
                layout: Layout::Release,
                tensors: [(
                    "w".to_string(),
                    (vec![4, 32], Storage::Bf16, vec![0.0; 128]),
                )]
                .into(),
            },
            views: [(
                "w".to_string(),
                StoredBytes::Dense(DenseDtype::Bf16, vec![0; 200]),
            )]
            .into(),
        });
        let lin = Linear::load(&short, "w", LinearKind::Bf16).unwrap();
        let e = lin
            .forward(&[0.0; 32], 1, &mut [0.0; 4], Numerics::Exact)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`w`") && e.contains("bytes"), "{e}");
    }

    /// A prefill longer than one block-major input copy (`matvec`'s `BLOCKED_ROWS`) runs in
    /// slabs of input rows: every output is the baseline copy's, bit for bit, for both rules
    /// and for the grouped product (inputs at an offset in each row).
    #[test]
    fn long_prefills_run_in_slabs_with_the_same_bits() {
        use super::super::simd::{self, Level};
        let mut rng = Rng::new(31);
        // Group width 40: a full block (the wide kernels, inputs at an offset) and a part.
        let (out, inp, groups, gw) = (24, 96, 3, 40);
        let w = random_fp8(out, inp, &mut rng);
        let g: Vec<f32> = (0..out * gw).map(|_| bf16(rng.uniform())).collect();
        let ckpt = mem(vec![
            ("w", vec![out, inp], Storage::Fp8Block, w.values.clone()),
            ("g", vec![out, gw], Storage::Bf16, g),
        ]);
        let fp8 = Linear::load(&ckpt, "w", LinearKind::Fp8).unwrap();
        let grouped = Linear::load(&ckpt, "g", LinearKind::Bf16).unwrap();
        // Two slabs: 512 + 18 rows, and 512 + a single row (taken by the one-row path).
        for rows in [530, 513] {
            let x = random_x(rows, inp, &mut rng);
            let xg = random_x(rows, groups * gw, &mut rng);
            for numerics in [Numerics::Upstream, Numerics::Exact] {
                let run = |level: Option<Level>| {
                    let (mut y, mut z) = (vec![0f32; rows * out], vec![0f32; rows * out]);
                    simd::cap_level(level);
                    let r = fp8.forward(&x, rows, &mut y, numerics).and_then(|()| {
                        grouped.forward_grouped(&xg, rows, groups, &mut z, numerics)
                    });
                    simd::cap_level(None);
                    r.unwrap();
                    (y, z)
                };
                let (want, got) = (run(Some(Level::Portable)), run(None));
                let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.0), bits(&want.0), "rows {rows} {numerics}");
                assert_eq!(
                    bits(&got.1),
                    bits(&want.1),
                    "grouped, rows {rows} {numerics}"
                );
            }
        }
    }

    /// A prefill's FP4 product on inputs and scales at the edges of the f32 range: the
    /// integer kernels' f32 shortcut (`vnni_prefill`'s `F32_STEPS`) must give way to their f64
    /// steps there, and every level gives the baseline copy's bits (groups of sixteen input
    /// rows mixing normal and extreme rows, a short last task of weight rows).
    #[test]
    fn prefill_fp4_products_keep_their_bits_at_the_range_edges() {
        let mut rng = Rng::new(41);
        let (out, inp, rows) = (13, 128, 37);
        let mut w = random_fp4(out, inp, &mut rng);
        let bi = inp / 32;
        // Scales from 2^−127 to 2^118 (the largest the vector paths take).
        for (n, e) in [(0, -127), (1, 118), (2, 100), (5, -120), (12, 90)] {
            for kb in 0..bi {
                w.scale_exp[n * bi + kb] = e;
                for k in 32 * kb..32 * kb + 32 {
                    w.values[n * inp + k] = e2m1_value(w.codes[n * inp + k]) * 2f32.powi(e);
                }
            }
        }
        let lin = stored_linear(Storage::Fp4, &w.values, w.packed(), &w.scale_exp, out, inp);
        let mut x = random_x(rows, inp, &mut rng);
        // Rows scaled so that the steps `scale · u` of row 0's scale 2^−127 fall below the
        // f32 range (2^−19: u = 2^−33), so that u does (2^−117: u = 2^−131, still
        // act-quantised in f32), and towards the top of f32.
        for (m, row) in x.chunks_exact_mut(inp).enumerate() {
            let e = [0, -19, -117, 60, 100][m % 5];
            row.iter_mut().for_each(|v| *v *= 2f32.powi(e));
        }
        every_level_gives_the_portable_bits(&lin, &x, rows);
    }

    /// The integer prefill kernels write an input block's integers in as few digits as its
    /// values' spread allows (VNNI: one per block for all rows); blocks needing one, two and
    /// three digits, side by side and mixed within a block, give the portable bits.
    #[test]
    fn prefill_fp4_products_keep_their_bits_for_any_digit_count() {
        let mut rng = Rng::new(43);
        let (out, inp, rows) = (21, 160, 19);
        let w = random_fp4(out, inp, &mut rng);
        let lin = stored_linear(Storage::Fp4, &w.values, w.packed(), &w.scale_exp, out, inp);
        let mut x = random_x(rows, inp, &mut rng);
        let sign = |k: usize| if k % 3 == 1 { -1.0 } else { 1.0 };
        for (m, row) in x.chunks_exact_mut(inp).enumerate() {
            let e = 2f32.powi(m as i32 % 7 - 3);
            for (kb, block) in row.chunks_exact_mut(32).enumerate() {
                for (k, v) in block.iter_mut().enumerate() {
                    *v = sign(k + m)
                        * e
                        * match kb {
                            // One digit: small multiples of a common power of two.
                            0 => [0.0, 1.0, 2.0, 3.0][(k + m) % 4],
                            // Three digits for row 5 (448 beside e4m3's least step 2^−9), two
                            // or three for the rest (random).
                            1 if m == 5 => [448.0, 2f32.powi(-9), 0.5][k % 3],
                            // The widest spread in every row, largest digit sums.
                            2 => [448.0, 2f32.powi(-9), 416.0, 2f32.powi(-8)][k % 4],
                            // Two digits: 448 and steps of 1/4.
                            3 => [448.0, 0.25, 240.0, 1.75][(k + m) % 4],
                            _ => *v / e,
                        };
                }
            }
        }
        every_level_gives_the_portable_bits(&lin, &x, rows);
    }

    /// A prefill's FP8 product in words (`vnni_words` and `avx2_fp8_prefill`, sixteen weight
    /// rows a task, the latter in two halves of eight): weight blocks whose exponents span at
    /// most 7, or 11 with sums too large for one pass, or more (split words), all-zero blocks,
    /// a NaN code (its task declined), scales at the edges; input blocks in one word or more,
    /// rows at the edges of the f32 range; several tasks and groups of input rows, the last
    /// ones short.
    #[test]
    fn prefill_fp8_products_keep_their_bits_for_any_word_count() {
        let mut rng = Rng::new(47);
        let (out, inp, rows) = (45, 192, 37);
        let mut w = random_fp8(out, inp, &mut rng);
        let bi = inp / 32;
        for n in 0..out {
            for kb in 0..bi {
                for k in 32 * kb..32 * kb + 32 {
                    let r = rng.next_u32();
                    let sign = (r as u8) & 0x80;
                    let mantissa = (r >> 16) as u8 & 7;
                    // One kind per task's block in even blocks (the VNNI kernel's rows
                    // share their words), one per half in odd ones (an AVX2 task's halves
                    // then differ: whole beside split, either beside zeros).
                    let task = n / if kb % 2 == 0 { 16 } else { 8 };
                    w.codes[n * inp + k] = match (task + kb) % 4 {
                        // Exponent fields 6 ..= 13 (a span of 7) and zeros.
                        0 if r.is_multiple_of(9) => sign,
                        0 => sign | ((6 + (r >> 8) % 8) as u8) << 3 | mantissa,
                        // Fields 2 ..= 13 (a span of 11, the most a word holds), mostly
                        // positive and the largest: with the largest inputs below, sums past
                        // 2^31 (one pass would wrap).
                        1 if r.is_multiple_of(7) => sign | ((2 + (r >> 8) % 12) as u8) << 3,
                        1 => 13 << 3 | mantissa,
                        // Subnormals beside the largest codes (a span of 14), or beside
                        // field 13 (12, one past a word): split words. 0x0F and 0x2F (W 15
                        // and 240 over e_min 0) set every bit of a split word's low byte.
                        2 if kb < 4 => {
                            sign | [0x01, 0x07, 0x7E, 0x78, 0x40, 0x0F, 0x2F][(r >> 8) as usize % 7]
                        }
                        2 => {
                            sign | [0x01, 0x07, 0x6F, 0x68, 0x40, 0x0F, 0x2F][(r >> 8) as usize % 7]
                        }
                        // All zero (both signs).
                        _ => sign,
                    };
                }
            }
        }
        // NaN: its task takes the generic path.
        w.codes[17 * inp + 40] = 0xFF;
        // Scales (one per 32 weight rows and block) at the edges: 2^−127 for every block of
        // rows 0 .. 32, so that their outputs are made of the smallest block sums; 2^118 and
        // 2^−120 for blocks of rows 32 ...
        w.scale_exp[..bi].fill(-127);
        for (b, e) in [(bi + 1, 118), (bi + 2, -120)] {
            w.scale_exp[b] = e;
        }
        for (i, v) in w.values.iter_mut().enumerate() {
            let (n, k) = (i / inp, i % inp);
            *v = e4m3_value(w.codes[i]) * 2f32.powi(w.scale_exp[(n / 32) * bi + k / 32]);
        }
        let lin = stored_linear(
            Storage::Fp8Block,
            &w.values,
            w.codes.clone(),
            &w.scale_exp,
            out,
            inp,
        );
        let mut x = random_x(rows, inp, &mut rng);
        for (m, row) in x.chunks_exact_mut(inp).enumerate() {
            let e = 2f32.powi([0, -19, -117, 60, 100, 3][m % 6]);
            for (kb, block) in row.chunks_exact_mut(32).enumerate() {
                for (k, v) in block.iter_mut().enumerate() {
                    *v = e * match kb % 3 {
                        // One word (|X| up to 15360), so that the f32 steps apply but for
                        // the rows and scales at the edges: with 2^−127 and rows scaled by
                        // 2^−19 the steps fall below f32's least subnormal, the block sums
                        // stay above bf16's.
                        0 => [240.0, -(2f32.powi(-6)), 0.0, 120.0][(k + m) % 4],
                        // Two words in every group: 448 beside e4m3's least step.
                        1 if m % 5 == 2 => [448.0, -(2f32.powi(-9)), 3.0][k % 3],
                        _ => *v,
                    };
                }
            }
        }
        every_level_gives_the_portable_bits(&lin, &x, rows);
    }

    /// A release linear read from its stored bytes (`codes`, scales `2^scale_exp`), as a
    /// release checkpoint is (the rows path is the baseline).
    fn stored_linear(
        storage: Storage,
        values: &[f32],
        codes: Vec<u8>,
        scale_exp: &[i32],
        out: usize,
        inp: usize,
    ) -> Linear {
        let (kind, lin_kind) = match storage {
            Storage::Fp4 => (crate::checkpoint::QuantKind::Fp4, LinearKind::Fp4),
            Storage::Fp8Block => (crate::checkpoint::QuantKind::Fp8Block, LinearKind::Fp8),
            other => panic!("no stored-byte release linear of {other:?}"),
        };
        let ckpt: Arc<dyn Checkpoint> = Arc::new(ViewCheckpoint {
            rows: MemCheckpoint {
                layout: Layout::Release,
                tensors: [("w".to_string(), (vec![out, inp], storage, values.to_vec()))].into(),
            },
            views: [(
                "w".to_string(),
                StoredBytes::Quant {
                    kind,
                    codes,
                    scales: scale_exp.iter().map(|&e| (e + 127) as u8).collect(),
                    scale_cols: inp / 32,
                },
            )]
            .into(),
        });
        Linear::load(&ckpt, "w", lin_kind).unwrap()
    }

    /// `lin` on `x` gives the same bits at every vector level this CPU has as portably, in
    /// both numerics profiles.
    fn every_level_gives_the_portable_bits(lin: &Linear, x: &[f32], rows: usize) {
        use super::super::simd::{self, Level};
        for numerics in [Numerics::Upstream, Numerics::Exact] {
            let run = |level: Level| {
                let mut y = vec![0f32; rows * lin.out_features()];
                simd::cap_level(Some(level));
                let r = lin.forward(x, rows, &mut y, numerics);
                simd::cap_level(None);
                r.unwrap();
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let want = run(Level::Portable);
            for level in Level::ALL.into_iter().filter(|&l| l <= simd::available()) {
                let got = run(level);
                let first = (0..want.len()).find(|&i| got[i] != want[i]);
                assert_eq!(first, None, "{numerics} {level:?}: first differing output");
            }
        }
    }

    /// `wo_a`'s grouped product: per output a C2 chain from −0.0 over its group's columns.
    #[test]
    fn grouped_forward_is_c2_per_group() {
        let mut rng = Rng::new(12);
        let (groups, per_group, gw, rows) = (3, 10, 40, 4);
        let wv: Vec<f32> = (0..groups * per_group * gw)
            .map(|_| bf16(rng.uniform()))
            .collect();
        let ckpt = mem(vec![(
            "wo_a",
            vec![groups * per_group, gw],
            Storage::Bf16,
            wv.clone(),
        )]);
        let lin = Linear::load(&ckpt, "wo_a", LinearKind::Bf16).unwrap();
        let x = random_x(rows, groups * gw, &mut rng);
        for numerics in [Numerics::Upstream, Numerics::Exact] {
            let mut y = vec![0f32; rows * groups * per_group];
            lin.forward_grouped(&x, rows, groups, &mut y, numerics)
                .unwrap();
            for m in 0..rows {
                for n in 0..groups * per_group {
                    let g = n / per_group;
                    let xr = &x[m * groups * gw + g * gw..][..gw];
                    let acc: f64 = wv[n * gw..(n + 1) * gw]
                        .iter()
                        .zip(xr)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    assert_eq!(
                        y[m * groups * per_group + n].to_bits(),
                        numerics.round1(acc as f32).to_bits()
                    );
                }
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
    use crate::model::quant::bf16;

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
