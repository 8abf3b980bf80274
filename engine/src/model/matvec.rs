//! Matrix-vector kernels on the stored weight bytes (MODEL.md §5.4 C1/C2).
//!
//! A task computes [`TILE`] output rows for every input row of a call. It walks the reduction in
//! 32-column blocks: the block of its weight rows is decoded straight from the mapped checkpoint
//! bytes ([`WeightView`]: e4m3 / e2m1 lookup tables times the block's E8M0 scale, bf16 / f16 / f32
//! rows, container Q8G / Q4G groups and VQ vectors) into a small stack array, then every input row
//! is run over it. No f32 copy of the weight rows is made per call, and in a prefill each block is
//! decoded once for all rows. A decode (one input row) under rule C2 on a weight that stays in
//! cache takes [`DECODE_TILE`] rows per task instead, enough independent chains for the vector
//! units; full FP8/FP4 blocks and full blocks of stored bf16 / f32 rows are decoded eight rows at a
//! time by the AVX2 decoders of [`simd`]. With AVX2 alone, a decode on release FP8/FP4 codes or
//! container Q4G / Q8G codes runs eight-row C1 loops (FP8 in f64 on the input copied into their
//! lane order, `simd::avx2`; nibbles and Q8G bytes in integers on the input's digits or words,
//! `simd::avx2_digits`), rule C2 sixteen rows in the lanes (`simd::avx2`), stored bf16
//! rows a 32-row C2 loop and container VQ rows those of `simd::vq`, in `DECODE_TILE`-row tasks.
//! Where the CPU has AVX-512, a decode is served by the eight-row kernels of `simd::avx512` instead
//! (rule C1 on every stored form of `ByteRows`, rule C2 likewise), in `DECODE_TILE`-row tasks; with
//! VNNI, rule C1 on release FP4 and container Q4G bytes sums in integers (`simd::vnni`, the input's
//! blocks found once per call). The commonest of these run as loops over a row group's blocks
//! rather than a call per block: C1 on FP8, FP4 and Q4G (eight rows, the next eight asked for on
//! the way for nibble rows), C2 on FP8 rows sharing a scale row and on Q8G/Q4G (32 rows), and
//! container VQ rows under either rule (`simd::vq`, 32 rows of an index band). A prefill with
//! AVX-512 decodes every `ByteRows` form eight rows at a time (`ByteRows::columns8`) and runs up to
//! eight input rows' chains per kernel call.
//!
//! The decoded values are exactly the values `Checkpoint::rows_f32` returns (same f32
//! products), widened to f64, and every output is the same sequence of f64 operations as a
//! kernel on dequantised rows: C1 sums each 32-block in f64 in increasing k, rounds it to f32
//! and accumulates blocks in f32 in increasing order; C2 is one f64 chain in increasing k.
//! Results therefore do not depend on the storage path, the vector level, the number of rows
//! in the call or the thread count. Storages without a view (Engram rows, a VQ bank whose
//! indices could be invalid, test doubles) are read with `rows_f32` into a per-thread scratch
//! buffer of the task's rows.
//!
//! Scratch buffers are per thread and reused, so a call allocates nothing once warmed up.

use std::cell::Cell;

#[cfg(target_arch = "x86_64")]
mod byte_rows;
#[cfg(target_arch = "x86_64")]
use byte_rows::{ByteRows, VqBlock};
#[cfg(target_arch = "x86_64")]
mod vq_rows;

use super::parallel::{for_each_chunk, try_for_each_chunk, worth_parallel};
use super::quant::{bf16, BLOCK};
use super::simd::amx::ActTiles;
#[cfg(target_arch = "x86_64")]
use super::simd::avx2::Codes;
use super::simd::avx2_digits::{DigitBlock, WordBlock};
use super::simd::avx2_fp4_prefill::ActWordBlocks;
use super::simd::vnni::{act_blocks, ActBlock, InputBlocks, IntegerInputs};
use super::simd::vnni_prefill::ActDigits;
use super::simd::vnni_words::ActWords;
use super::simd::{self, madd, Level};
use crate::checkpoint::{Checkpoint, DenseDtype, QuantKind, QuantView, WeightView, VQ_WIDTH};
use crate::dtype::{
    bf16_to_f32, e2m1_pair, e4m3_to_f32, e8m0_to_f32, e8m0_to_f64, f16_to_f32, E2M1_PAIR_F64,
    E4M3_F64,
};
use crate::Result;

/// Output rows of one task: independent f64 chains that keep the FPU pipelines busy.
pub(crate) const TILE: usize = 8;

/// One 32-column block of a task's weight rows: `w[k][i]` = row `i`, column `k0 + k`.
type WeightBlock = [[f64; TILE]; BLOCK];

/// Weight rows of one single-row (decode) task under rule C2: enough independent chains to
/// hide the fused multiply-add's latency with four-lane vectors.
pub(crate) const DECODE_TILE: usize = 32;

/// Input rows per block-major input copy ([`MatVec::x_by_block`]): 20 MiB at width 5120.
const BLOCKED_ROWS: usize = 512;

/// Weights up to which a decode call runs [`DECODE_TILE`]-row tasks (a megabyte of FP8
/// codes).
const WIDE_TASK_WEIGHTS: usize = 1 << 20;

/// [`WeightBlock`] for [`DECODE_TILE`] rows.
type WideBlock = [[f64; DECODE_TILE]; BLOCK];

/// Where a kernel reads its weight rows from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// Decoded from the stored bytes.
    View(WeightView<'a>),
    /// Dequantised by the checkpoint (`rows_f32`) into scratch, a task's rows at a time.
    Rows {
        ckpt: &'a dyn Checkpoint,
        name: &'a str,
    },
}

/// The summation rule of a call (MODEL.md §5.4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rule {
    /// Each 32-block exactly (f64), rounded to f32, blocks accumulated in f32.
    C1,
    /// One f64 chain in increasing k starting from `init` (0.0, or −0.0 where the reference
    /// is an iterator `sum`).
    C2 { init: f64 },
}

/// One matrix-vector (or matrix-matrix) product `y[m, n] = Σ_k x[m, k] · W[w_first + n, k]`.
#[derive(Clone, Copy)]
pub(crate) struct MatVec<'a> {
    pub source: Source<'a>,
    /// Reduction length (the weight's row length).
    pub n_in: usize,
    /// Weight row of output 0.
    pub w_first: usize,
    /// Inputs widened to f64: row m is `x[m · x_stride + x_off ..][..n_in]`.
    pub x: &'a [f64],
    pub x_stride: usize,
    pub x_off: usize,
    pub rows: usize,
    pub rule: Rule,
    /// Round every output to bf16 (the upstream bf16 linears).
    pub round_out: bool,
    /// The input's blocks as integers, for the VNNI nibble kernels (set by [`MatVec::run`];
    /// none where the input has no integer form). Only the x86 kernels read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub x_blocks: Option<&'a [ActBlock]>,
    /// The inputs' full 32-blocks block-major, for the AVX2 and AVX-512 prefill kernels: block
    /// kb of row m at `[kb · rows + m]`, so that a group of rows' blocks is one run read at
    /// constant offsets (set by [`MatVec::run`] for at most [`BLOCKED_ROWS`] rows at a time;
    /// none for a single row, without AVX2, or where [`Self::x_ints`] is set).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub x_by_block: Option<&'a [[f64; BLOCK]]>,
    /// The inputs as integers, for a prefill's release FP4 or FP8 product (set by
    /// [`MatVec::run`] from [`Level::Avx2`] up; none where an input block is not
    /// act-quantised).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub x_ints: Option<ActInts<'a>>,
    /// A single input row in the form of the AVX2 C1 kernel for its weight's codes (set by
    /// [`MatVec::run`] at [`Level::Avx2`], none where a block is not act-quantised).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub x_avx2: Option<Avx2Input<'a>>,
}

/// A single act-quantised input row as an AVX2 C1 kernel reads it.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Avx2Input<'a> {
    /// FP8 codes: the input in the lane order of `simd::avx2::fp8_c1_run8`.
    Lanes(&'a [f64]),
    /// FP4 / Q4G codes: the blocks as integer digits (`simd::avx2_digits`).
    Digits(&'a [DigitBlock]),
    /// Q8G codes: the blocks as integer words (`simd::avx2_digits`).
    Words(&'a [WordBlock]),
}

/// A prefill's act-quantised inputs in the integer form of the kernel that takes them.
#[derive(Clone, Copy)]
pub enum ActInts<'a> {
    /// AMX limb tiles ([`Level::Amx`]).
    Tiles(&'a ActTiles),
    /// Base-256 digits for the VNNI FP4 kernel ([`Level::Avx512Vnni`]).
    Digits(&'a ActDigits),
    /// Words for the AVX2 FP4 kernel ([`Level::Avx2`]).
    Pairs(&'a ActWordBlocks),
    /// Words for the VNNI FP8 kernel (from [`Level::Avx512Vnni`] up).
    Words(&'a ActWords),
    /// The same words for the AVX2 FP8 kernel ([`Level::Avx2`]). The kernel is chosen with
    /// the form, from one reading of the level: a test may cap the level meanwhile.
    Avx2Words(&'a ActWords),
}

impl ActInts<'_> {
    /// Weight rows per task of the kernel that reads this form.
    fn task_rows(self) -> usize {
        match self {
            ActInts::Tiles(_) => simd::amx::W_ROWS,
            ActInts::Digits(_) => simd::vnni_prefill::W_ROWS,
            ActInts::Pairs(_) => simd::avx2_fp4_prefill::W_ROWS,
            ActInts::Words(_) => simd::vnni_words::W_ROWS,
            ActInts::Avx2Words(_) => simd::avx2_fp8_prefill::W_ROWS,
        }
    }
}

impl MatVec<'_> {
    /// Compute `n_out` outputs into `y`, row m at `y[m · y_stride + y_off ..][..n_out]`.
    pub fn run(&self, n_out: usize, y: &mut [f32], y_stride: usize, y_off: usize) -> Result<()> {
        if self.wants_act_blocks() {
            // Found once per call, for every task; none (the f64 kernel) if the input is not
            // act-quantised after all.
            let mut blocks = ACT_BLOCK_SCRATCH.with(Cell::take);
            let found = act_blocks(&self.x[self.x_off..][..self.n_in], &mut blocks);
            let r = MatVec {
                x_blocks: found.then_some(&blocks[..]),
                ..*self
            }
            .run_tasks(n_out, y, y_stride, y_off);
            ACT_BLOCK_SCRATCH.with(|c| c.set(blocks));
            return r;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(codes) = self.lane_codes() {
            // Once per call, for every task; none (the block-by-block path) if the input is
            // not act-quantised after all.
            let x = &self.x[self.x_off..][..self.n_in];
            let mut lanes = INPUT_LANE_SCRATCH.with(Cell::take);
            let mut digits = INPUT_DIGIT_SCRATCH.with(Cell::take);
            let mut words = INPUT_WORD_SCRATCH.with(Cell::take);
            let x_avx2 = match codes {
                Codes::Fp8 => lanes.fill(x).map(Avx2Input::Lanes),
                Codes::Fp4 | Codes::Q4 => digits.fill(x).map(Avx2Input::Digits),
                Codes::Q8 => words.fill(x).map(Avx2Input::Words),
            };
            let r = MatVec { x_avx2, ..*self }.run_tasks(n_out, y, y_stride, y_off);
            INPUT_LANE_SCRATCH.with(|c| c.set(lanes));
            INPUT_DIGIT_SCRATCH.with(|c| c.set(digits));
            INPUT_WORD_SCRATCH.with(|c| c.set(words));
            return r;
        }
        if self.rows > 1 && simd::level() >= Level::Avx2 {
            // A long prefill runs as slabs of input rows, each with its own copy, so that the
            // copy stays small whatever the chunk's length (outputs are per input row).
            let mut blocked = BLOCKED_INPUT_SCRATCH.with(Cell::take);
            let mut tiles = ACT_TILE_SCRATCH.with(Cell::take);
            let mut digits = ACT_DIGIT_SCRATCH.with(Cell::take);
            let mut words = ACT_WORD_SCRATCH.with(Cell::take);
            let mut pairs = ACT_PAIR_SCRATCH.with(Cell::take);
            let r = (0..self.rows).step_by(BLOCKED_ROWS).try_for_each(|m0| {
                let slab = MatVec {
                    x_off: self.x_off + m0 * self.x_stride,
                    rows: BLOCKED_ROWS.min(self.rows - m0),
                    ..*self
                };
                let input = slab.input_blocks();
                let ints = match slab.act_ints_kind() {
                    None => None,
                    Some(QuantKind::Fp8Block | QuantKind::Fp8Rows)
                        if simd::level() >= Level::Avx512Vnni =>
                    {
                        words.fill(input).then_some(ActInts::Words(&words))
                    }
                    Some(QuantKind::Fp8Block | QuantKind::Fp8Rows) => {
                        words.fill(input).then_some(ActInts::Avx2Words(&words))
                    }
                    Some(QuantKind::Fp4) if simd::level() >= Level::Amx => {
                        tiles.fill(input).then_some(ActInts::Tiles(&tiles))
                    }
                    Some(QuantKind::Fp4) if simd::level() >= Level::Avx512Vnni => {
                        digits.fill(input).then_some(ActInts::Digits(&digits))
                    }
                    Some(QuantKind::Fp4) => pairs.fill(input).then_some(ActInts::Pairs(&pairs)),
                };
                // The integer kernels read their own form; a task they decline (a scale
                // above the limit) reads the inputs row-major, the same bits, so no copy
                // is made.
                if ints.is_none() {
                    blocked.clear();
                    for kb in 0..input.blocks {
                        blocked.extend((0..input.rows).map(|m| *input.block(m, kb)));
                    }
                }
                MatVec {
                    x_by_block: ints.is_none().then_some(&blocked[..]),
                    x_ints: ints,
                    ..slab
                }
                .run_tasks(n_out, y, y_stride, y_off + m0 * y_stride)
            });
            BLOCKED_INPUT_SCRATCH.with(|c| c.set(blocked));
            ACT_TILE_SCRATCH.with(|c| c.set(tiles));
            ACT_DIGIT_SCRATCH.with(|c| c.set(digits));
            ACT_WORD_SCRATCH.with(|c| c.set(words));
            ACT_PAIR_SCRATCH.with(|c| c.set(pairs));
            return r;
        }
        self.run_tasks(n_out, y, y_stride, y_off)
    }

    /// The input rows' full blocks.
    fn input_blocks(&self) -> InputBlocks<'_> {
        InputBlocks {
            x: self.x,
            stride: self.x_stride,
            off: self.x_off,
            rows: self.rows,
            blocks: self.n_in / BLOCK,
        }
    }

    /// [`Self::run`] once the input's integer blocks are settled.
    fn run_tasks(&self, n_out: usize, y: &mut [f32], y_stride: usize, y_off: usize) -> Result<()> {
        // The work is the multiply-adds, or the weight bytes read where those are more: rows
        // streamed from memory cost more than their arithmetic (mHC's 24 × 4·dim f32 rows,
        // 2 MiB below a million multiply-adds, took ~0.5 ms a call on the calling thread
        // while the pool waited).
        let parallel = worth_parallel(n_out * self.n_in * self.rows.max(self.value_bytes()));
        if self.rows == 1 {
            // Decode: each task owns a contiguous slice of y. Wide tasks for a weight that
            // stays in cache; from a larger one, streamed from memory, tasks of TILE rows
            // measured twice as fast (fewer rows walked at once) but for the AVX-512 FP8/FP4
            // kernels, whose C2 chains need the wide tasks' independent rows.
            let wide = n_out * self.n_in <= WIDE_TASK_WEIGHTS
                || (simd::level() >= Level::Avx512 && self.byte_rows_decode())
                || (simd::level() == Level::Avx2 && self.avx2_decode());
            // A weight of few, long rows (mHC's 24 × 4·dim) would be one wide task, read by
            // one thread while the others wait: TILE-row tasks give each thread a share.
            let one_task = n_out <= DECODE_TILE;
            let size = if wide && !(parallel && one_task) {
                DECODE_TILE
            } else {
                TILE
            };
            let ys = &mut y[y_off..y_off + n_out];
            return try_for_each_chunk(ys, size, parallel, |t, ych| self.task(t * size, ych));
        }
        // Prefill: tasks fill an output-major buffer, transposed into y afterwards.
        let rows = self.rows;
        let task_rows = self.x_ints.map_or(TILE, ActInts::task_rows);
        let mut yt = take(&OUTPUT_SCRATCH, n_out * rows, 0.0);
        let r = try_for_each_chunk(&mut yt, task_rows * rows, parallel, |t, ych| {
            self.task(t * task_rows, ych)
        });
        if r.is_ok() {
            output_rows_from_columns(&yt, rows, &mut y[y_off..], y_stride);
        }
        put(&OUTPUT_SCRATCH, yt);
        r
    }

    /// Outputs `first .. first + out.len() / rows`, output-major (`out[i · rows + m]`).
    ///
    /// The body is compiled for the target's baseline, with AVX2 and with AVX-512 (see
    /// [`simd`]), and the copy is chosen at run time; all give the same bits. The AVX-512 copy
    /// serves only the single-row kernels it was written for: the compiler's own AVX-512
    /// code for the other loops (gathers for table lookups) measured up to 1.5x slower on
    /// Zen 4 than their AVX2 code.
    fn task(&self, first: usize, out: &mut [f32]) -> Result<()> {
        match simd::level() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `level` reports Avx512 only where the CPU has its features.
            l if l >= Level::Avx512 && self.byte_rows_decode() => unsafe {
                self.task_avx512(first, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `level` reports Avx2 or above only where the CPU has AVX2, FMA, F16C.
            l if l >= Level::Avx2 => unsafe { self.task_avx2(first, out) },
            _ => self.task_body(first, out, Level::Portable),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn task_avx2(&self, first: usize, out: &mut [f32]) -> Result<()> {
        self.task_body(first, out, Level::Avx2)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    unsafe fn task_avx512(&self, first: usize, out: &mut [f32]) -> Result<()> {
        self.task_body(first, out, Level::Avx512)
    }

    #[inline(always)]
    fn task_body(&self, first: usize, out: &mut [f32], level: Level) -> Result<()> {
        let rows = self.rows;
        if rows == 1 {
            #[cfg(target_arch = "x86_64")]
            if let (Level::Avx2 | Level::Avx512, Source::View(WeightView::Vq(v))) =
                (level, &self.source)
            {
                if self.vq_rows32(*v, first, out, level) {
                    return Ok(());
                }
            }
            #[cfg(target_arch = "x86_64")]
            if let (Level::Avx512, Rule::C2 { init }, Source::View(view)) =
                (level, self.rule, &self.source)
            {
                if let Some(bytes) = ByteRows::of(*view) {
                    self.c2_rows8(bytes, init, first, out);
                    return Ok(());
                }
            }
            #[cfg(target_arch = "x86_64")]
            if let (Level::Avx512, Rule::C1, Source::View(view)) = (level, self.rule, &self.source)
            {
                if let Some(bytes) =
                    ByteRows::of(*view).filter(|b| !matches!(b, ByteRows::Quant(_)))
                {
                    for (t, o) in out.chunks_mut(TILE).enumerate() {
                        if o.len() == TILE {
                            o.copy_from_slice(&self.c1_byte_rows8(bytes, first + t * TILE));
                        } else {
                            self.task_tile(first + t * TILE, o, level)?;
                        }
                    }
                    return Ok(());
                }
            }
            #[cfg(target_arch = "x86_64")]
            if let (Level::Avx2, Rule::C2 { init }) = (level, self.rule) {
                if self.avx2_rows::<1>(self.w_first).is_some() {
                    return self.c2_rows16(init, first, out);
                }
                if self.dense_view() {
                    return self.c2_dense_rows32(init, first, out);
                }
            }
            #[cfg(target_arch = "x86_64")]
            if let (Level::Avx2, Some(input)) = (level, self.x_avx2) {
                for (t, o) in out.chunks_mut(TILE).enumerate() {
                    if o.len() == TILE {
                        o.copy_from_slice(&self.c1_avx2_8(self.w_first + first + t * TILE, input));
                    } else {
                        self.task_tile(first + t * TILE, o, level)?;
                    }
                }
                return Ok(());
            }
            if let (Rule::C2 { init }, true) = (self.rule, out.len() > TILE) {
                return self.task_c2_single(init, first, out, level);
            }
            if let Source::View(WeightView::Quant(view)) = &self.source {
                for (t, o) in out.chunks_mut(TILE).enumerate() {
                    match self.rule {
                        Rule::C1 => self.task_single(*view, first + t * TILE, o, level),
                        Rule::C2 { init } => {
                            self.task_single_c2(*view, init, first + t * TILE, o, level)
                        }
                    }
                }
                return Ok(());
            }
            // A loop, not a closure: a closure's body is compiled without this function's
            // target features, and its multiply-adds would become calls to a software fma.
            for (t, o) in out.chunks_mut(TILE).enumerate() {
                self.task_tile(first + t * TILE, o, level)?;
            }
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if self.x_ints.is_some() {
            if self.c1_ints(self.w_first + first, out.len() / rows, out) {
                return Ok(());
            }
            // Declined: the generic path, a tile of rows at a time (the layout is the same).
            for (t, o) in out.chunks_mut(TILE * rows).enumerate() {
                self.task_tile(first + t * TILE, o, level)?;
            }
            return Ok(());
        }
        self.task_tile(first, out, level)
    }

    /// Rule C2 for one input row over up to [`DECODE_TILE`] weight rows: each 32-column
    /// block of the rows is decoded into a column-major f64 block, then every row's chain
    /// advances over it in increasing k. The rows are independent chains, as many as the
    /// vector units can keep in flight (a tile of [`TILE`] rows is bound by one chain's
    /// latency).
    #[inline(always)]
    fn task_c2_single(&self, init: f64, first: usize, out: &mut [f32], level: Level) -> Result<()> {
        let nw = out.len();
        let row_buf = self.read_rows(first, nw)?;
        let r0 = self.w_first + first;
        let x = &self.x[self.x_off..][..self.n_in];
        let mut acc = [init; DECODE_TILE];
        // This thread's block (not a fresh 8 KiB array per task); lanes ≥ nw hold zeros,
        // and their chains are never written out.
        let mut w = WIDE_SCRATCH_BLOCK
            .with(Cell::take)
            .unwrap_or_else(|| Box::new([[0.0; DECODE_TILE]; BLOCK]));
        if nw < DECODE_TILE {
            w.iter_mut().for_each(|wk| wk[nw..].fill(0.0));
        }
        for k0 in (0..self.n_in).step_by(BLOCK) {
            let len = BLOCK.min(self.n_in - k0);
            self.decode(&row_buf, r0, nw, k0, len, &mut w, level);
            let (xs, ws) = (&x[k0..k0 + len], &w[..len]);
            #[cfg(target_arch = "x86_64")]
            if level >= Level::Avx2 {
                // SAFETY: `level` is Avx2 or above only inside `task_avx2` / `task_avx512`.
                unsafe { simd::x86::chains_32(&mut acc, xs, ws) };
                continue;
            }
            for (wk, &xk) in ws.iter().zip(xs) {
                for (a, &wi) in acc.iter_mut().zip(wk) {
                    *a = madd(level, *a, xk, wi);
                }
            }
        }
        WIDE_SCRATCH_BLOCK.with(|c| c.set(Some(w)));
        self.c2_outputs(out, &acc);
        put(&WEIGHT_SCRATCH, row_buf);
        Ok(())
    }

    /// A single-row task's outputs from its rows' C2 chains: rounded to f32, then to bf16
    /// where the kind's output is bf16.
    fn c2_outputs(&self, out: &mut [f32], acc: &[f64]) {
        for (o, &a) in out.iter_mut().zip(acc) {
            let v = a as f32;
            *o = if self.round_out { bf16(v) } else { v };
        }
    }

    /// This thread's weight scratch, holding weight rows `first .. first + nw` when the
    /// source is read with `rows_f32` (empty otherwise); given back with `put`.
    fn read_rows(&self, first: usize, nw: usize) -> Result<Vec<f32>> {
        let mut row_buf = take(&WEIGHT_SCRATCH, 0, 0.0);
        if let Source::Rows { ckpt, name } = self.source {
            row_buf.resize(nw * self.n_in, 0.0);
            if let Err(e) = ckpt.rows_f32(name, self.w_first + first, &mut row_buf) {
                put(&WEIGHT_SCRATCH, row_buf);
                return Err(e);
            }
        }
        Ok(row_buf)
    }

    /// Outputs `first .. first + out.len() / rows` for at most [`TILE`] weight rows.
    #[inline(always)]
    fn task_tile(&self, first: usize, out: &mut [f32], level: Level) -> Result<()> {
        let rows = self.rows;
        let nw = out.len() / rows;
        let row_buf = self.read_rows(first, nw)?;
        // Rows ≥ nw of a short last task stay zero and are never written out.
        let mut w: WeightBlock = [[0.0; TILE]; BLOCK];
        let r0 = self.w_first + first;
        let largest = largest_group(level);
        match self.rule {
            Rule::C1 => {
                // Per input row m, its eight weight rows' f32 sums (`sums[m][i]`): one vector
                // add per block, written out output-major at the end.
                let mut sums = take(&C1_SUM_SCRATCH, rows * TILE, 0.0);
                let (sum_rows, _) = sums.as_chunks_mut::<TILE>();
                for k0 in (0..self.n_in).step_by(BLOCK) {
                    let len = BLOCK.min(self.n_in - k0);
                    self.decode(&row_buf, r0, nw, k0, len, &mut w, level);
                    #[cfg(target_arch = "x86_64")]
                    if let (Level::Avx2, BLOCK) = (level, len) {
                        // SAFETY: `level` is Avx2 only inside `task_avx2`.
                        unsafe { simd::avx2_prefill::c1_block(sum_rows, self.input_rows(k0), &w) };
                        continue;
                    }
                    for (m, n) in row_groups(rows, largest) {
                        let sums = &mut sum_rows[m..m + n];
                        #[cfg(target_arch = "x86_64")]
                        if let (WIDE_GROUP, BLOCK, Some(xs)) =
                            (largest, len, self.group_blocks(m, n, k0))
                        {
                            // SAFETY: `largest_group` gives WIDE_GROUP only where the CPU has
                            // AVX-512.
                            unsafe { simd::avx512::c1_rows_any(sums, xs, &w) };
                            continue;
                        }
                        let mut blocks = [[0f64; TILE]; WIDE_GROUP];
                        self.dot_group(&mut blocks[..n], m, k0, len, &w, level, largest);
                        for (s, block) in sums.iter_mut().zip(&blocks) {
                            for (s, &b) in s.iter_mut().zip(block) {
                                *s += b as f32;
                            }
                        }
                    }
                }
                for (m, s) in sum_rows.iter().enumerate() {
                    for (i, &v) in s[..nw].iter().enumerate() {
                        out[i * rows + m] = if self.round_out { bf16(v) } else { v };
                    }
                }
                put(&C1_SUM_SCRATCH, sums);
            }
            Rule::C2 { init } => {
                let mut acc = take(&ACC_SCRATCH, rows * TILE, init);
                let (chains, _) = acc.as_chunks_mut::<TILE>();
                for k0 in (0..self.n_in).step_by(BLOCK) {
                    let len = BLOCK.min(self.n_in - k0);
                    self.decode(&row_buf, r0, nw, k0, len, &mut w, level);
                    #[cfg(target_arch = "x86_64")]
                    if let (Level::Avx2, BLOCK) = (level, len) {
                        // SAFETY: `level` is Avx2 only inside `task_avx2`.
                        unsafe { simd::avx2_prefill::c2_block(chains, self.input_rows(k0), &w) };
                        continue;
                    }
                    for (m, n) in row_groups(rows, largest) {
                        let group = &mut chains[m..m + n];
                        self.dot_group(group, m, k0, len, &w, level, largest);
                    }
                }
                for (m, a) in chains.iter().enumerate() {
                    for (i, &a) in a[..nw].iter().enumerate() {
                        let v = a as f32;
                        out[i * rows + m] = if self.round_out { bf16(v) } else { v };
                    }
                }
                put(&ACC_SCRATCH, acc);
            }
        }
        put(&WEIGHT_SCRATCH, row_buf);
        Ok(())
    }

    /// Rule C1 for one input row (decode) on release FP8/FP4 bytes, block by block
    /// ([`Self::c1_block`]); eight rows at a time at [`Level::Avx512`].
    #[inline(always)]
    fn task_single(&self, v: QuantView, first: usize, out: &mut [f32], level: Level) {
        let r0 = self.w_first + first;
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx512 {
            if let Ok(out) = <&mut [f32; TILE]>::try_from(&mut *out) {
                *out = self.c1_rows8(v, r0);
                if self.round_out {
                    out.iter_mut().for_each(|o| *o = bf16(*o));
                }
                return;
            }
        }
        for (i, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for k0 in (0..self.n_in).step_by(BLOCK) {
                acc += self.c1_block(v, r0 + i, k0, level) as f32;
            }
            *o = if self.round_out { bf16(acc) } else { acc };
        }
    }

    /// Rule C1 for one input row over weight rows `r0 .. r0 + 8` with the AVX-512 kernels,
    /// a full block of the eight rows at a time; a block they leave (a NaN code, a scale
    /// that could overflow f32) and a partial block are taken row by row, in place.
    ///
    /// Only called at [`Level::Avx512`], i.e. inside `task_avx512`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c1_rows8(&self, v: QuantView, r0: usize) -> [f32; TILE] {
        let x = &self.x[self.x_off..][..self.n_in];
        let fp4 = v.kind == QuantKind::Fp4;
        let row_bytes = if fp4 { v.cols / 2 } else { v.cols };
        let scales: [&[u8]; TILE] = eight(
            #[inline(always)]
            |i| &v.scales[scale_at(&v, r0 + i, 0)..][..self.n_in.div_ceil(BLOCK)],
        );
        let codes: [&[u8]; TILE] = eight(
            #[inline(always)]
            |i| &v.codes[(r0 + i) * row_bytes..][..row_bytes],
        );
        // FP8 scales are per 32 × 32 block: the eight rows of a task usually share theirs,
        // one byte per block instead of eight.
        let shared = scale_at(&v, r0, 0) == scale_at(&v, r0 + TILE - 1, 0);
        let scales = simd::avx512::RowScales {
            bytes: if shared && !fp4 {
                simd::avx512::ScaleBytes::Shared(scales[0])
            } else {
                simd::avx512::ScaleBytes::PerRow(scales)
            },
            limit: SAFE_SCALE_BYTE,
        };
        let full = self.n_in / BLOCK;
        let mut acc = [0f32; TILE];
        let mut kb = 0;
        while kb < full {
            // The loops run until a block they leave (a NaN code, a scale that could overflow
            // f32), which is taken row by row, in place.
            kb = match (fp4, self.x_blocks) {
                // SAFETY: only reached from `task_avx512`.
                (false, _) => unsafe {
                    simd::avx512::fp8_c1_run8(&mut acc, x, codes, scales, kb..full)
                },
                // SAFETY: `x_blocks` is set only at `Level::Avx512Vnni` (`wants_act_blocks`),
                // so the CPU has VNNI.
                (true, Some(xi)) => unsafe {
                    let next = ByteRows::Quant(v).rows_span(r0 + TILE, TILE);
                    let next = simd::avx512::NextRows::over(next, full);
                    let scales = simd::vnni::NibbleScales::Fp4(scales);
                    simd::vnni::nibble_c1_run8_vnni(&mut acc, xi, codes, scales, next, kb..full)
                },
                // Inputs without an integer form (not act-quantised): the f64 kernel.
                (true, None) => {
                    while let Some(s) = (kb < full)
                        .then(|| release_scales8(&v, r0, kb * BLOCK))
                        .flatten()
                    {
                        let xb = x[kb * BLOCK..][..BLOCK].try_into().expect("block");
                        let rows = ByteRows::packed_blocks(&codes, kb * BLOCK / 2);
                        // SAFETY: only reached from `task_avx512`.
                        unsafe { simd::avx512::fp4_c1_block8(&mut acc, xb, rows, &s) };
                        kb += 1;
                    }
                    kb
                }
            };
            if kb < full {
                for (i, a) in acc.iter_mut().enumerate() {
                    *a += self.c1_block(v, r0 + i, kb * BLOCK, Level::Avx512) as f32;
                }
                kb += 1;
            }
        }
        let tail = self.n_in - self.n_in % BLOCK;
        if tail < self.n_in {
            for (i, a) in acc.iter_mut().enumerate() {
                *a += self.c1_block(v, r0 + i, tail, Level::Avx512) as f32;
            }
        }
        acc
    }

    /// The rows `r0 .. r0 + N` as the AVX2 kernels read them (`simd::avx2`,
    /// `simd::avx2_digits`): release FP8/FP4 codes with their E8M0 scales, or container Q4G /
    /// Q8G codes with their f16 group scales where groups are whole column blocks; `None` for
    /// other weights.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn avx2_rows<const N: usize>(
        &self,
        r0: usize,
    ) -> Option<(simd::avx2::Codes, [&[u8]; N], simd::avx2::Scales<'_, N>)> {
        use simd::avx2::Scales;
        let full = self.n_in / BLOCK;
        match self.source {
            Source::View(WeightView::Quant(v)) => {
                let (codes, row_bytes) = match v.kind {
                    QuantKind::Fp4 => (Codes::Fp4, v.cols / 2),
                    QuantKind::Fp8Block | QuantKind::Fp8Rows => (Codes::Fp8, v.cols),
                };
                let rows = std::array::from_fn(|i| &v.codes[(r0 + i) * row_bytes..][..row_bytes]);
                let scales = Scales::E8m0 {
                    rows: std::array::from_fn(|i| &v.scales[scale_at(&v, r0 + i, 0)..][..full]),
                    limit: SAFE_SCALE_BYTE,
                };
                Some((codes, rows, scales))
            }
            Source::View(WeightView::Grouped {
                bits: bits @ (4 | 8),
                cols,
                group,
                row_bytes,
                codes,
                scales,
                ..
            }) if group.is_multiple_of(BLOCK) => {
                let groups = cols.div_ceil(group);
                let rows = std::array::from_fn(|i| &codes[(r0 + i) * row_bytes..][..row_bytes]);
                let scales = Scales::F16 {
                    rows: std::array::from_fn(|i| &scales[2 * (r0 + i) * groups..][..2 * groups]),
                    blocks_per_group: group / BLOCK,
                };
                Some((if bits == 4 { Codes::Q4 } else { Codes::Q8 }, rows, scales))
            }
            _ => None,
        }
    }

    /// Rule C1 for one input row over weight rows `r0 .. r0 + 8` with the AVX2 kernel for
    /// the input's form (`simd::avx2` on FP8 lanes, `simd::avx2_digits` on nibble digits and
    /// Q8G words),
    /// every full block of the eight rows at a time; a block it leaves (a NaN code, a scale it
    /// does not take) and a partial block take the generic block decode, in place.
    ///
    /// Only called at [`Level::Avx2`], i.e. inside `task_avx2`, where [`Self::avx2_rows`]
    /// serves the weight.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c1_avx2_8(&self, r0: usize, input: Avx2Input) -> [f32; TILE] {
        let Some((codes, rows, scales)) = self.avx2_rows::<TILE>(r0) else {
            unreachable!("x_avx2 is set only for weights the AVX2 kernels read");
        };
        let full = self.n_in / BLOCK;
        let mut acc = [0f32; TILE];
        let mut kb = 0;
        while kb < full {
            // SAFETY: only reached from `task_avx2`; the input, rows and scales hold `full`
            // blocks, and `MatVec::run` made the input's form for these codes.
            kb = unsafe {
                match (input, codes) {
                    (Avx2Input::Lanes(x), simd::avx2::Codes::Fp8) => {
                        simd::avx2::fp8_c1_run8(&mut acc, x, rows, scales, kb..full)
                    }
                    (Avx2Input::Words(x), _) => {
                        simd::avx2_digits::q8_c1_run8(&mut acc, x, rows, scales, kb..full)
                    }
                    (Avx2Input::Digits(x), _) => simd::avx2_digits::nibble_c1_run8(
                        codes,
                        &mut acc,
                        x,
                        rows,
                        scales,
                        kb..full,
                    ),
                    (Avx2Input::Lanes(_), _) => unreachable!("lanes are made for FP8 codes only"),
                }
            };
            if kb < full {
                self.c1_block8(r0, kb * BLOCK, &mut acc);
                kb += 1;
            }
        }
        if full * BLOCK < self.n_in {
            self.c1_block8(r0, full * BLOCK, &mut acc);
        }
        if self.round_out {
            acc.iter_mut().for_each(|a| *a = bf16(*a));
        }
        acc
    }

    /// One column block (at `k0`) of eight rows' C1 sums from `r0` by the generic block
    /// decode.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c1_block8(&self, r0: usize, k0: usize, acc: &mut [f32; TILE]) {
        let (mut block, mut w) = ([0f64; TILE], [[0.0; TILE]; BLOCK]);
        self.block_chains((r0, TILE, k0), &mut block, &mut w, Level::Avx2);
        for (a, b) in acc.iter_mut().zip(block) {
            *a += b as f32;
        }
    }

    /// Rule C2 for one input row over weight rows `first ..` that [`Self::avx2_rows`] serves,
    /// with the AVX2 kernel sixteen rows at a time (`simd::avx2::c2_run16`); a block it leaves
    /// (a NaN code, a scale it does not take) and a partial block take the generic block
    /// decode for those rows, in place, and fewer than sixteen rows the generic tile path.
    ///
    /// Only called at [`Level::Avx2`], i.e. inside `task_avx2`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c2_rows16(&self, init: f64, first: usize, out: &mut [f32]) -> Result<()> {
        const ROWS: usize = 16;
        let x = &self.x[self.x_off..][..self.n_in];
        let full = self.n_in / BLOCK;
        let done = out.len() - out.len() % ROWS;
        let mut chunks = out.chunks_exact_mut(ROWS);
        for (t, o) in chunks.by_ref().enumerate() {
            let r0 = self.w_first + first + t * ROWS;
            let Some((codes, rows, scales)) = self.avx2_rows::<ROWS>(r0) else {
                unreachable!("called only for weights the AVX2 kernels read");
            };
            let mut acc = [init; ROWS];
            let mut kb = 0;
            while kb < full {
                // SAFETY: only reached from `task_avx2`; the input, rows and scales hold
                // `full` blocks.
                kb = unsafe { simd::avx2::c2_run16(codes, &mut acc, x, rows, scales, kb..full) };
                if kb < full {
                    self.c2_block_rows(r0, kb * BLOCK, &mut acc);
                    kb += 1;
                }
            }
            if full * BLOCK < self.n_in {
                self.c2_block_rows(r0, full * BLOCK, &mut acc);
            }
            self.c2_outputs(o, &acc);
        }
        for (t, o) in chunks.into_remainder().chunks_mut(TILE).enumerate() {
            self.task_tile(first + done + t * TILE, o, Level::Avx2)?;
        }
        Ok(())
    }

    /// One column block (at `k0`) of the C2 chains of rows `r0 .. r0 + acc.len()` (a multiple
    /// of eight) by the generic block decode, eight rows at a time.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c2_block_rows(&self, r0: usize, k0: usize, acc: &mut [f64]) {
        let mut w: WeightBlock = [[0.0; TILE]; BLOCK];
        for (g, chains) in acc.chunks_exact_mut(TILE).enumerate() {
            let chains = chains.try_into().expect("eight chains");
            self.block_chains((r0 + g * TILE, TILE, k0), chains, &mut w, Level::Avx2);
        }
    }

    /// Rule C2 for one input row over stored bf16 rows `first ..` with the AVX2 loop, 32
    /// rows at a time (`simd::avx2::dense_c2_run32`, every full block); a partial block takes
    /// the generic block decode for those rows, in place, and fewer than 32 rows the generic
    /// tile path.
    ///
    /// Only called at [`Level::Avx2`], i.e. inside `task_avx2`, where [`Self::dense_view`]
    /// holds.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c2_dense_rows32(&self, init: f64, first: usize, out: &mut [f32]) -> Result<()> {
        let Source::View(view) = self.source else {
            unreachable!("called only for stored bf16 rows");
        };
        let Some(bytes @ ByteRows::Dense { bf16: true, .. }) = ByteRows::of(view) else {
            unreachable!("called only for stored bf16 rows");
        };
        let x = &self.x[self.x_off..][..self.n_in];
        let full = self.n_in / BLOCK;
        let done = out.len() - out.len() % DECODE_TILE;
        let mut chunks = out.chunks_exact_mut(DECODE_TILE);
        for (t, o) in chunks.by_ref().enumerate() {
            let r0 = self.w_first + first + t * DECODE_TILE;
            let rows: [&[u8]; DECODE_TILE] = std::array::from_fn(|i| bytes.row(r0 + i));
            let mut acc = [init; DECODE_TILE];
            // SAFETY: only reached from `task_avx2`; the input and rows hold `full` blocks.
            unsafe { simd::avx2::dense_c2_run32(&mut acc, x, &rows, 0..full) };
            if full * BLOCK < self.n_in {
                self.c2_block_rows(r0, full * BLOCK, &mut acc);
            }
            self.c2_outputs(o, &acc);
        }
        for (t, o) in chunks.into_remainder().chunks_mut(TILE).enumerate() {
            self.task_tile(first + done + t * TILE, o, Level::Avx2)?;
        }
        Ok(())
    }

    /// Rule C2 for one input row over up to [`DECODE_TILE`] rows of stored bytes with the
    /// AVX-512 kernels ([`ByteRows`]): eight rows' chains per vector, four vectors of
    /// independent chains. A group of fewer than eight rows, a partial block, or a block the
    /// kernel leaves (a NaN code, a scale that could overflow f32) takes the generic block
    /// decode for that group and block, in place.
    ///
    /// Only called at [`Level::Avx512`], i.e. inside `task_avx512`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c2_rows8(&self, bytes: ByteRows, init: f64, first: usize, out: &mut [f32]) {
        let nw = out.len();
        let r0 = self.w_first + first;
        let x = &self.x[self.x_off..][..self.n_in];
        let mut acc = [init; DECODE_TILE];
        // Scratch for the blocks the kernels leave, once per task (not per block).
        let mut scratch = ([[0.0; TILE]; BLOCK], [[0.0; BLOCK]; TILE]);
        // The rows' bytes, found once per task rather than once per block (lanes ≥ nw: none).
        let rows: [&[u8]; DECODE_TILE] =
            std::array::from_fn(|i| if i < nw { bytes.row(r0 + i) } else { &[] });
        // Release FP8 rows sharing one scale row, and FP4 rows: the 32-row loops, each block
        // they leave taken group by group, then the loop resumed after it.
        let mut from = 0;
        if let (ByteRows::Quant(v), DECODE_TILE) = (bytes, nw) {
            let full = self.n_in / BLOCK;
            let scales = |r: usize| &v.scales[scale_at(&v, r, 0)..][..full];
            let shared = scale_at(&v, r0, 0) == scale_at(&v, r0 + nw - 1, 0);
            let run = match v.kind {
                QuantKind::Fp8Block if shared => Some(false),
                QuantKind::Fp4 => Some(true),
                _ => None,
            };
            while let Some(fp4) = run.filter(|_| from < full) {
                let scale_rows = |bytes| simd::avx512::RowScales {
                    bytes,
                    limit: SAFE_SCALE_BYTE,
                };
                // SAFETY: only reached from `task_avx512`; rows, inputs and scales hold
                // `full` blocks.
                from = unsafe {
                    if fp4 {
                        let group = |g: usize| {
                            scale_rows(simd::avx512::ScaleBytes::PerRow(eight(
                                #[inline(always)]
                                |i| scales(r0 + 8 * g + i),
                            )))
                        };
                        let groups = [group(0), group(1), group(2), group(3)];
                        simd::avx512::fp4_c2_run32(&mut acc, x, &rows, groups, from..full)
                    } else {
                        let shared = scale_rows(simd::avx512::ScaleBytes::Shared(scales(r0)));
                        simd::avx512::fp8_c2_run32(&mut acc, x, &rows, shared, from..full)
                    }
                };
                if from < full {
                    let at = (from * BLOCK, r0, nw);
                    self.c2_block_groups(bytes, &rows, at, &mut acc, &mut scratch);
                    from += 1;
                }
            }
        }
        // Stored bf16 / f32 rows: the 32-row loop over every full block.
        if let (ByteRows::Dense { bf16, .. }, DECODE_TILE) = (bytes, nw) {
            let full = self.n_in / BLOCK;
            // SAFETY: only reached from `task_avx512`; rows and inputs hold `full` blocks.
            unsafe { simd::avx512::dense_c2_run32(&mut acc, x, &rows, bf16, 0..full) };
            from = full;
        }
        // Container Q8G / Q4G rows: the 32-row loop over every full block.
        if let Some(codes) = (nw == DECODE_TILE).then(|| bytes.int_rows32(r0)).flatten() {
            let full = self.n_in / BLOCK;
            // SAFETY: only reached from `task_avx512`; rows, inputs and scales hold `full`
            // blocks.
            unsafe { simd::avx512::int_c2_run32(&mut acc, x, &rows, codes, 0..full) };
            from = full;
        }
        for k0 in (from * BLOCK..self.n_in).step_by(BLOCK) {
            self.c2_block_groups(bytes, &rows, (k0, r0, nw), &mut acc, &mut scratch);
        }
        self.c2_outputs(out, &acc);
    }

    /// One column block (at `k0`) of [`Self::c2_rows8`]'s `nw` rows from `r0`, group by
    /// group: the AVX-512 kernel where it takes the block, else the generic block decode.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c2_block_groups(
        &self,
        bytes: ByteRows,
        rows: &[&[u8]; DECODE_TILE],
        (k0, r0, nw): (usize, usize, usize),
        acc: &mut [f64; DECODE_TILE],
        (w, values): &mut (WeightBlock, VqBlock),
    ) {
        let x = &self.x[self.x_off..][..self.n_in];
        let len = BLOCK.min(self.n_in - k0);
        // Thirty-two rows walked at once are too many streams for the hardware prefetcher
        // (the FP8 kernel ran at a third of its in-cache rate): fetch each row ahead, a
        // cache line at a time.
        simd::avx512::prefetch_rows(&rows[..nw], bytes.offset(k0));
        for (g, chains) in acc
            .chunks_exact_mut(TILE)
            .enumerate()
            .take(nw.div_ceil(TILE))
        {
            let chains: &mut [f64; TILE] = chains.try_into().expect("eight chains");
            let (rg, n) = (r0 + g * TILE, (nw - g * TILE).min(TILE));
            let fast = n == TILE && len == BLOCK && {
                let xb: &[f64; BLOCK] = x[k0..k0 + BLOCK].try_into().expect("block");
                let group = rows[g * TILE..][..TILE].try_into().expect("eight rows");
                bytes.block8(group, rg, k0, xb, chains, values)
            };
            if !fast {
                self.block_chains((rg, n, k0), chains, w, Level::Avx512);
            }
        }
    }

    /// Rule C1 for one input row over weight rows `first ..` (eight) of stored bytes other
    /// than release codes (container Q8G/Q4G groups and VQ vectors, bf16 / f32 rows) with the
    /// AVX-512 kernels (`ByteRows::c1_block8`); a block they leave (a scale that is not
    /// finite) and a partial block take the generic block decode, in place, as `task_tile`
    /// does.
    ///
    /// Only called at [`Level::Avx512`], i.e. inside `task_avx512`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c1_byte_rows8(&self, bytes: ByteRows, first: usize) -> [f32; TILE] {
        let r0 = self.w_first + first;
        let rows: [&[u8]; TILE] = eight(
            #[inline(always)]
            |i| bytes.row(r0 + i),
        );
        let mut acc = [0f32; TILE];
        let mut w: WeightBlock = [[0.0; TILE]; BLOCK];
        let mut values: VqBlock = [[0.0; BLOCK]; TILE];
        let full = self.n_in / BLOCK;
        let mut from = 0;
        // Container Q4G rows on an act-quantised input: the VNNI nibble loop, each block it
        // leaves taken by the single-block path, then the loop resumed after it.
        if let (Some(scales), Some(xi)) = (bytes.nibble_scales(r0), self.x_blocks) {
            let next = simd::avx512::NextRows::over(bytes.rows_span(r0 + TILE, TILE), full);
            while from < full {
                // SAFETY: `x_blocks` is set only at `Level::Avx512Vnni` (`wants_act_blocks`);
                // the rows, inputs and scales hold `full` blocks.
                from = unsafe {
                    simd::vnni::nibble_c1_run8_vnni(&mut acc, xi, rows, scales, next, from..full)
                };
                if from < full {
                    self.c1_byte_block(
                        bytes,
                        &rows,
                        (r0, from * BLOCK),
                        &mut acc,
                        (&mut w, &mut values),
                    );
                    from += 1;
                }
            }
        }
        for k0 in (from * BLOCK..self.n_in).step_by(BLOCK) {
            self.c1_byte_block(bytes, &rows, (r0, k0), &mut acc, (&mut w, &mut values));
        }
        if self.round_out {
            acc.iter_mut().for_each(|a| *a = bf16(*a));
        }
        acc
    }

    /// One column block (at `k0`) of [`Self::c1_byte_rows8`]'s eight rows from `r0`: the
    /// AVX-512 kernel where it takes the block, else the generic block decode.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn c1_byte_block(
        &self,
        bytes: ByteRows,
        rows: &[&[u8]; TILE],
        (r0, k0): (usize, usize),
        acc: &mut [f32; TILE],
        (w, values): (&mut WeightBlock, &mut VqBlock),
    ) {
        let x = &self.x[self.x_off..][..self.n_in];
        let len = BLOCK.min(self.n_in - k0);
        let done = len == BLOCK && {
            let xb: &[f64; BLOCK] = x[k0..k0 + BLOCK].try_into().expect("block");
            bytes.c1_block8(rows, r0, k0, xb, acc, values)
        };
        if !done {
            let mut block = [0f64; TILE];
            self.block_chains((r0, TILE, k0), &mut block, w, Level::Avx512);
            for (a, b) in acc.iter_mut().zip(block) {
                *a += b as f32;
            }
        }
    }

    /// Rule C1 of a prefill task's `nw` release FP4 or FP8 weight rows from `r0` with the
    /// integer kernel of [`Self::x_ints`]: `false` where a block's scale could overflow f32
    /// with some code or an FP8 code is NaN (the generic path then takes those rows and
    /// rewrites `out`).
    #[cfg(target_arch = "x86_64")]
    fn c1_ints(&self, r0: usize, nw: usize, out: &mut [f32]) -> bool {
        let (Some(ints), Source::View(WeightView::Quant(v))) = (self.x_ints, &self.source) else {
            return false;
        };
        let blocks = self.n_in / BLOCK;
        let bytes = match v.kind {
            QuantKind::Fp4 => self.n_in / 2,
            QuantKind::Fp8Block | QuantKind::Fp8Rows => self.n_in,
        };
        const ROWS: usize = 16;
        assert!(nw <= ROWS && nw <= ints.task_rows());
        let (mut codes, mut scales): ([&[u8]; ROWS], [&[u8]; ROWS]) = ([&[]; ROWS], [&[]; ROWS]);
        for (i, r) in (r0..r0 + nw).enumerate() {
            codes[i] = &v.codes[r * bytes..][..bytes];
            scales[i] = &v.scales[scale_at(v, r, 0)..][..blocks];
        }
        let (codes, scales) = (&codes[..nw], &scales[..nw]);
        if scales
            .iter()
            .any(|s| s.iter().any(|&b| b > SAFE_SCALE_BYTE))
        {
            return false;
        }
        // SAFETY: tiles are made only at `Level::Amx`, digits and VNNI words only from
        // `Level::Avx512Vnni` up, pairs and AVX2 words only from `Level::Avx2` up
        // (`MatVec::run`), which imply the kernels' features (AMX: `amx::usable`); each form
        // only for its codes' kind (`act_ints_kind`); the rows and scales hold every block;
        // scales checked.
        let done = match ints {
            ActInts::Tiles(tiles) => unsafe {
                simd::amx::fp4_c1_rows(out, tiles, codes, scales);
                true
            },
            ActInts::Digits(digits) => unsafe {
                simd::vnni_prefill::fp4_c1_rows(out, digits, codes, scales);
                true
            },
            ActInts::Pairs(pairs) => unsafe {
                simd::avx2_fp4_prefill::fp4_c1_rows(out, pairs, codes, scales);
                true
            },
            ActInts::Words(words) => unsafe {
                simd::vnni_words::fp8_c1_rows(out, words, codes, scales)
            },
            ActInts::Avx2Words(words) => unsafe {
                simd::avx2_fp8_prefill::fp8_c1_rows(out, words, codes, scales)
            },
        };
        if done && self.round_out {
            out.iter_mut().for_each(|v| *v = bf16(*v));
        }
        done
    }

    /// A single-row C1 product on packed nibbles (release FP4, container Q4G) at
    /// [`Level::Avx512Vnni`]: the VNNI kernels', which read the input's integer blocks.
    fn wants_act_blocks(&self) -> bool {
        let nibbles = match self.source {
            Source::View(WeightView::Quant(v)) => v.kind == QuantKind::Fp4,
            Source::View(WeightView::Grouped { bits, .. }) => bits == 4,
            _ => false,
        };
        self.rows == 1 && self.rule == Rule::C1 && nibbles && simd::level() >= Level::Avx512Vnni
    }

    /// A single-row C1 product at [`Level::Avx2`] on a weight the AVX2 kernels read
    /// ([`Self::avx2_rows`]): its codes, whose lane order the input is copied into.
    #[cfg(target_arch = "x86_64")]
    fn lane_codes(&self) -> Option<simd::avx2::Codes> {
        if self.rows != 1 || self.rule != Rule::C1 || simd::level() != Level::Avx2 {
            return None;
        }
        self.avx2_rows::<1>(self.w_first).map(|(codes, ..)| codes)
    }

    /// A prefill's rule C1 product on release FP4 or FP8 codes from [`Level::Avx2`] up: the
    /// integer kernels', which read the inputs as limb tiles (AMX, FP4), digits (VNNI, FP4) or
    /// words (FP8; AVX2, FP4). The codes' kind, where they apply.
    fn act_ints_kind(&self) -> Option<QuantKind> {
        let Source::View(WeightView::Quant(v)) = self.source else {
            return None;
        };
        (self.rows > 1
            && self.rule == Rule::C1
            && self.n_in.is_multiple_of(BLOCK)
            && simd::level() >= Level::Avx2)
            .then_some(v.kind)
    }

    /// A single-row product on a weight of the AVX2 loops (`simd::avx2`, `simd::vq`), which
    /// take 32-row tasks whatever the weight's size.
    #[cfg(target_arch = "x86_64")]
    fn avx2_decode(&self) -> bool {
        self.avx2_rows::<1>(self.w_first).is_some() || self.vq_view() || self.dense_view()
    }

    /// Stored bf16 rows (the 32-row loop `simd::avx2::dense_c2_run32`). Stored f32 rows stay
    /// in eight-row tasks (the tile decoder): the 32-row loop ran them at half that rate, its
    /// 64 cache lines per block more than the prefetches in flight (measured, Zen 3).
    #[cfg(target_arch = "x86_64")]
    fn dense_view(&self) -> bool {
        let Source::View(view) = self.source else {
            return false;
        };
        matches!(ByteRows::of(view), Some(ByteRows::Dense { bf16: true, .. }))
    }

    /// No AVX2 loops off x86.
    #[cfg(not(target_arch = "x86_64"))]
    fn avx2_decode(&self) -> bool {
        false
    }

    /// Container VQ rows (the 32-row loops of `simd::vq`).
    #[cfg(target_arch = "x86_64")]
    fn vq_view(&self) -> bool {
        matches!(self.source, Source::View(WeightView::Vq(_)))
    }

    /// A single-row product the AVX-512 kernels serve: any [`ByteRows`], under either rule.
    #[cfg(target_arch = "x86_64")]
    fn byte_rows_decode(&self) -> bool {
        let Source::View(view) = &self.source else {
            return false;
        };
        self.rows == 1 && ByteRows::of(*view).is_some()
    }

    /// No AVX-512 kernels off x86.
    #[cfg(not(target_arch = "x86_64"))]
    fn byte_rows_decode(&self) -> bool {
        false
    }

    /// Stored bytes per weight, for the work a call counts: a dense view's width; one
    /// otherwise (the quantised forms store a byte or less, a rows source is counted alike).
    fn value_bytes(&self) -> usize {
        match self.source {
            Source::View(WeightView::Dense { dtype, .. }) => dtype.width(),
            _ => 1,
        }
    }

    /// One C1 block of weight row `r` at columns `k0 ..` (a multiple of 32): the exact block
    /// sum `Σ x·code` times the E8M0 scale, before its rounding to f32. Each weight is
    /// decoded inside the reduction loop, nothing is stored. The block sum of an FP8/FP4 GEMM
    /// is exact in f64 in any order (module note of `linear`), so it is summed with
    /// independent partial sums and the scale multiplies it once, which equals summing the
    /// scaled weights. A block whose scale could overflow f32 (byte > [`SAFE_SCALE_BYTE`],
    /// never in a real checkpoint), a NaN code or a partial block takes the generic block
    /// decode, with the same result.
    #[inline(always)]
    fn c1_block(&self, v: QuantView, r: usize, k0: usize, level: Level) -> f64 {
        let x = &self.x[self.x_off..][..self.n_in];
        let sb = v.scales[scale_at(&v, r, k0)];
        if self.n_in - k0 < BLOCK || sb > SAFE_SCALE_BYTE {
            let len = BLOCK.min(self.n_in - k0);
            let mut w: WeightBlock = [[0.0; TILE]; BLOCK];
            self.decode(&[], r, 1, k0, len, &mut w, level);
            let mut block = [[0f64; TILE]];
            dot_rows(&mut block, [&x[k0..k0 + len]], &w, level);
            return block[0][0];
        }
        let xb: &[f64; BLOCK] = x[k0..k0 + BLOCK].try_into().expect("block");
        let part = if v.kind == QuantKind::Fp4 {
            let half = v.codes[r * (v.cols / 2) + k0 / 2..][..BLOCK / 2]
                .try_into()
                .expect("half block");
            match level {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only reached from `task_avx2` / `task_avx512`.
                l if l >= Level::Avx2 => unsafe { simd::x86::fp4_block_sum(xb, half) },
                _ => fp4_block_sum(xb, half),
            }
        } else {
            let block = v.codes[r * v.cols + k0..][..BLOCK]
                .try_into()
                .expect("block");
            match level {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                l if l >= Level::Avx2 => unsafe { simd::x86::fp8_block_sum(xb, block) }
                    .unwrap_or_else(|| fp8_block_sum(xb, block)),
                _ => fp8_block_sum(xb, block),
            }
        };
        part * e8m0_to_f64(sb)
    }

    /// Rule C2 for one input row over at most [`TILE`] rows of release FP8/FP4 bytes (a
    /// weight too large for [`DECODE_TILE`]-row tasks): the rows advance their f64 chains
    /// together in increasing k, each weight `code · scale` (exact in f32 and f64 alike)
    /// from a table inside the loop. A block whose scale could overflow f32, a partial block
    /// or a short tile takes the generic block decode, with the same result.
    #[inline(always)]
    fn task_single_c2(&self, v: QuantView, init: f64, first: usize, out: &mut [f32], level: Level) {
        let nw = out.len();
        let r0 = self.w_first + first;
        let x = &self.x[self.x_off..][..self.n_in];
        let fp4 = v.kind == QuantKind::Fp4;
        let row_bytes = if fp4 { v.cols / 2 } else { v.cols };
        let safe = |r: usize, k0: usize| {
            self.n_in - k0 >= BLOCK && v.scales[scale_at(&v, r, k0)] <= SAFE_SCALE_BYTE
        };
        let scale = |r: usize, k0: usize| e8m0_to_f64(v.scales[scale_at(&v, r, k0)]);
        let mut w: WeightBlock = [[0.0; TILE]; BLOCK];
        let mut acc = [init; TILE];
        for k0 in (0..self.n_in).step_by(BLOCK) {
            let len = BLOCK.min(self.n_in - k0);
            if nw == TILE && (0..TILE).all(|i| safe(r0 + i, k0)) {
                let s: [f64; TILE] = std::array::from_fn(|i| scale(r0 + i, k0));
                let xb: &[f64; BLOCK] = x[k0..k0 + BLOCK].try_into().expect("block");
                let base = &v.codes[r0 * row_bytes..][..TILE * row_bytes];
                if fp4 {
                    fp4_block_c2(&mut acc, xb, base, row_bytes, k0 / 2, &s, level);
                } else {
                    fp8_block_c2(&mut acc, xb, base, row_bytes, k0, &s, level);
                }
            } else {
                self.decode(&[], r0, nw, k0, len, &mut w, level);
                let mut chains = [acc];
                dot_rows(&mut chains, [&x[k0..k0 + len]], &w, level);
                acc = chains[0];
            }
        }
        self.c2_outputs(out, &acc);
    }

    /// [`dot_rows`] for input rows `m .. m + chains.len()` (a group of [`row_groups`]): with
    /// AVX-512 in one kernel call per full block, otherwise GROUP rows at a time, then one.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn dot_group(
        &self,
        chains: &mut [[f64; TILE]],
        m: usize,
        k0: usize,
        len: usize,
        w: &WeightBlock,
        level: Level,
        largest: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        if let (WIDE_GROUP, BLOCK, Some(xs)) =
            (largest, len, self.group_blocks(m, chains.len(), k0))
        {
            // SAFETY: `largest_group` gives WIDE_GROUP only where the CPU has AVX-512.
            unsafe { simd::avx512::dot_rows_any(chains, xs, w) };
            return;
        }
        // Elsewhere groups are never wider than GROUP.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = largest;
        let rest = m + chains.len() / GROUP * GROUP;
        let mut groups = chains.chunks_exact_mut(GROUP);
        for (g, group) in (&mut groups).enumerate() {
            let xs: [&[f64]; GROUP] = std::array::from_fn(|j| self.xs(m + GROUP * g + j, k0, len));
            dot_rows(group.try_into().expect("a group"), xs, w, level);
        }
        for (j, one) in groups.into_remainder().iter_mut().enumerate() {
            dot_rows(
                std::array::from_mut(one),
                [self.xs(rest + j, k0, len)],
                w,
                level,
            );
        }
    }

    /// The full blocks at `k0` of input rows `m .. m + n`, one run (from
    /// [`Self::x_by_block`], if set).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn group_blocks(&self, m: usize, n: usize, k0: usize) -> Option<&[[f64; BLOCK]]> {
        let at = k0 / BLOCK * self.rows + m;
        self.x_by_block?.get(at..at + n)
    }

    /// Every input row's values of the full block at `k0`, for the AVX2 prefill kernels: from
    /// the block-major copy if there is one (the rows' blocks one run, read in order, where
    /// row-major rows a width apart measured a quarter slower out of the caches).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn input_rows(&self, k0: usize) -> simd::avx2_prefill::InputRows<'_> {
        match self.x_by_block {
            Some(blocks) => simd::avx2_prefill::InputRows {
                x: blocks.as_flattened(),
                first: k0 * self.rows,
                stride: BLOCK,
            },
            None => simd::avx2_prefill::InputRows {
                x: self.x,
                first: self.x_off + k0,
                stride: self.x_stride,
            },
        }
    }

    #[inline(always)]
    fn xs(&self, m: usize, k0: usize, len: usize) -> &[f64] {
        &self.x[m * self.x_stride + self.x_off + k0..][..len]
    }

    /// Weight rows `r0 .. r0 + n`'s chains advanced over the column block at `k0` by the
    /// generic block decode (into `w`), the fallback of every vector loop: C2 chains as
    /// they are, a C1 block sum from chains of +0.0.
    #[inline(always)]
    fn block_chains(
        &self,
        (r0, n, k0): (usize, usize, usize),
        chains: &mut [f64; TILE],
        w: &mut WeightBlock,
        level: Level,
    ) {
        let x = &self.x[self.x_off..][..self.n_in];
        let len = BLOCK.min(self.n_in - k0);
        self.decode(&[], r0, n, k0, len, w, level);
        let mut c = [*chains];
        dot_rows(&mut c, [&x[k0..k0 + len]], w, level);
        *chains = c[0];
    }

    /// Fill `w[..len][..nw]` with weight rows `r0 ..` at columns `k0 .. k0 + len` (a
    /// 32-aligned block): the exact f32 values of `rows_f32`, widened.
    ///
    /// Eight rows of full FP8/FP4 blocks at a time with the vector decoder where it applies;
    /// otherwise row by row, with no division or format test per weight.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn decode<const W: usize>(
        &self,
        row_buf: &[f32],
        r0: usize,
        nw: usize,
        k0: usize,
        len: usize,
        w: &mut [[f64; W]; BLOCK],
        level: Level,
    ) {
        #[cfg(target_arch = "x86_64")]
        let tiles = match self.source {
            Source::View(view) if level >= Level::Avx2 && len == BLOCK => {
                if let Some(ByteRows::Dense { bf16, cols, bytes }) = ByteRows::of(view) {
                    Some(TileDecoder::Dense { bf16, cols, bytes })
                } else if simd::level() >= Level::Avx512 {
                    ByteRows::of(view).map(TileDecoder::Avx512)
                } else if let WeightView::Quant(v) = view {
                    Some(TileDecoder::Avx2(v))
                } else {
                    None
                }
            }
            _ => None,
        };
        // Off x86 every row takes the row decoder.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = level;
        let mut i = 0;
        while i < nw {
            #[cfg(target_arch = "x86_64")]
            if nw - i >= 8 {
                let done = match tiles {
                    Some(TileDecoder::Avx512(bytes)) => bytes.columns8(r0 + i, k0, w, i),
                    Some(TileDecoder::Avx2(v)) => quant_tile(&v, r0 + i, k0, i, w),
                    Some(TileDecoder::Dense { bf16, cols, bytes }) => {
                        let width = if bf16 { 2 } else { 4 };
                        let rows = eight(
                            #[inline(always)]
                            |j| &bytes[((r0 + i + j) * cols + k0) * width..][..BLOCK * width],
                        );
                        // SAFETY: the caller runs at Level::Avx2 or above, which `simd`
                        // reports only where the CPU has AVX2, FMA and F16C.
                        unsafe { simd::x86::dense_columns(rows, bf16, w, i) };
                        true
                    }
                    None => false,
                };
                if done {
                    i += 8;
                    continue;
                }
            }
            match self.source {
                Source::Rows { .. } => {
                    let vals = &row_buf[i * self.n_in + k0..][..len];
                    for (wk, &v) in w.iter_mut().zip(vals) {
                        wk[i] = f64::from(v);
                    }
                }
                Source::View(view) => decode_row_block(view, r0 + i, k0, len, w, i),
            }
            i += 1;
        }
    }
}

/// The vector decoder that `MatVec::decode` runs on eight rows of a full block at a time.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum TileDecoder<'a> {
    /// AVX-512: any stored form [`ByteRows`] covers ([`ByteRows::columns8`]).
    Avx512(ByteRows<'a>),
    /// AVX2: release FP8/FP4 codes ([`quant_tile`]).
    Avx2(QuantView<'a>),
    /// AVX2 at either level: stored bf16 or f32 rows of `cols` values
    /// (`simd::x86::dense_columns`).
    Dense {
        bf16: bool,
        cols: usize,
        bytes: &'a [u8],
    },
}

/// Eight rows `r ..` of a full FP8/FP4 block into columns `i .. i + 8` of `w` with the AVX2
/// decoder (the same f64 values as the row decoder): `false`, nothing written, for a scale
/// that could overflow f32 or a NaN code, which the row decoder then takes.
///
/// Only called at [`Level::Avx2`] or above, i.e. inside `task_avx2` / `task_avx512`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn quant_tile<const W: usize>(
    v: &QuantView,
    r: usize,
    k0: usize,
    i: usize,
    w: &mut [[f64; W]; BLOCK],
) -> bool {
    let Some(s) = release_scales8(v, r, k0) else {
        return false;
    };
    if v.kind == QuantKind::Fp4 {
        let rb = v.cols / 2;
        let rows = std::array::from_fn(|j| {
            v.codes[(r + j) * rb + k0 / 2..][..BLOCK / 2]
                .try_into()
                .expect("half block")
        });
        // SAFETY: the caller runs at Level::Avx2 or above, which `simd` reports only where the CPU
        // has AVX2, FMA and F16C.
        unsafe { simd::x86::fp4_tile(rows, &s, w, i) };
        true
    } else {
        let rows = std::array::from_fn(|j| {
            v.codes[(r + j) * v.cols + k0..][..BLOCK]
                .try_into()
                .expect("block")
        });
        // SAFETY: as above.
        unsafe { simd::x86::fp8_tile(rows, &s, w, i) }
    }
}

/// Weight row `r`, columns `k0 .. k0 + len` (within one 32-block) of a stored view, as the
/// exact f32 values `rows_f32` gives, widened into column `i` of `w` (`w[k][i]`). Written as
/// zipped loops over `w`'s rows: an index per weight would be bounds-checked per weight.
#[inline(always)]
fn decode_row_block<const W: usize>(
    view: WeightView,
    r: usize,
    k0: usize,
    len: usize,
    w: &mut [[f64; W]; BLOCK],
    i: usize,
) {
    let w = &mut w[..len];
    match view {
        WeightView::Quant(v) => {
            let s = e8m0_to_f32(v.scales[scale_at(&v, r, k0)]);
            if v.kind == QuantKind::Fp4 {
                let codes = &v.codes[r * (v.cols / 2) + k0 / 2..][..len / 2];
                for (pair, &b) in w.chunks_exact_mut(2).zip(codes) {
                    let [lo, hi] = e2m1_pair(b);
                    pair[0][i] = f64::from(lo * s);
                    pair[1][i] = f64::from(hi * s);
                }
            } else {
                let codes = &v.codes[r * v.cols + k0..][..len];
                for (wk, &c) in w.iter_mut().zip(codes) {
                    wk[i] = f64::from(e4m3_to_f32(c) * s);
                }
            }
        }
        WeightView::Dense {
            dtype, cols, bytes, ..
        } => {
            let width = dtype.width();
            let row = &bytes[(r * cols + k0) * width..][..len * width];
            // One loop per dtype: a conversion chosen through a function pointer is called
            // per weight instead of inlined.
            match dtype {
                DenseDtype::F32 => {
                    for (wk, c) in w.iter_mut().zip(row.chunks_exact(4)) {
                        wk[i] = f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    }
                }
                DenseDtype::Bf16 => {
                    for (wk, c) in w.iter_mut().zip(row.chunks_exact(2)) {
                        wk[i] = f64::from(bf16_to_f32(u16::from_le_bytes([c[0], c[1]])));
                    }
                }
                DenseDtype::F16 => {
                    for (wk, c) in w.iter_mut().zip(row.chunks_exact(2)) {
                        wk[i] = f64::from(f16_to_f32(u16::from_le_bytes([c[0], c[1]])));
                    }
                }
            }
        }
        WeightView::Vq(v) => {
            // A block is whole vectors: 32-aligned, and `cols` is a multiple of eight.
            for (j, run) in w.chunks_exact_mut(VQ_WIDTH).enumerate() {
                let values = v.vector(r, k0 / VQ_WIDTH + j);
                for (wk, &x) in run.iter_mut().zip(&values) {
                    wk[i] = f64::from(x);
                }
            }
        }
        WeightView::Grouped {
            bits,
            cols,
            group,
            row_bytes,
            codes,
            scales,
            ..
        } => {
            let groups = cols.div_ceil(group);
            let data = &codes[r * row_bytes..][..row_bytes];
            let sc = &scales[r * groups * 2..][..groups * 2];
            // The block in runs of one group each: one f16 scale per run, no division per
            // weight.
            let mut k = 0;
            while k < len {
                let g = (k0 + k) / group;
                let end = ((g + 1) * group - k0).min(len);
                let s = f16_to_f32(u16::from_le_bytes([sc[2 * g], sc[2 * g + 1]]));
                let c0 = k0 + k;
                let run = &mut w[k..end];
                if bits == 8 {
                    for (wk, &b) in run.iter_mut().zip(&data[c0..k0 + end]) {
                        wk[i] = f64::from(f32::from(b as i8) * s);
                    }
                } else {
                    let value = |n: u8| f32::from(i8::try_from(n & 0xF).expect("nibble") - 8) * s;
                    if c0.is_multiple_of(2) && (end - k).is_multiple_of(2) {
                        // Whole bytes: low nibble first.
                        for (pair, &b) in run.chunks_exact_mut(2).zip(&data[c0 / 2..(k0 + end) / 2])
                        {
                            pair[0][i] = f64::from(value(b));
                            pair[1][i] = f64::from(value(b >> 4));
                        }
                    } else {
                        for (j, wk) in run.iter_mut().enumerate() {
                            let c = c0 + j;
                            wk[i] = f64::from(value(data[c / 2] >> (4 * (c % 2))));
                        }
                    }
                }
                k = end;
            }
        }
    }
}

/// `[f(0), .., f(7)]`, written out: `std::array::from_fn` with a fallible closure (a slice
/// converted to an array) was left out of line and cost ~7% of a decode in the per-block
/// loops.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn eight<T>(f: impl Fn(usize) -> T) -> [T; TILE] {
    [f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7)]
}

/// Largest E8M0 byte for which every e4m3 / e2m1 value times the scale is finite in f32
/// (448 · 2^(245−127) < 2^128), so `code · scale` is the same number in f32 and in f64.
const SAFE_SCALE_BYTE: u8 = 245;

/// The E8M0 scales of weight rows `r .. r + 8` at the column block starting at `k0`, as f64;
/// `None` if one could overflow f32 with some code (those blocks take the generic decode).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn release_scales8(v: &QuantView, r: usize, k0: usize) -> Option<[f64; TILE]> {
    let sb: [u8; TILE] = eight(
        #[inline(always)]
        |i| v.scales[scale_at(v, r + i, k0)],
    );
    // Written out: through `array::map` the conversion was an out-of-line call per block.
    sb.iter().all(|&b| b <= SAFE_SCALE_BYTE).then(|| {
        eight(
            #[inline(always)]
            |i| e8m0_to_f64(sb[i]),
        )
    })
}

/// Index of the E8M0 scale of weight row `r`, column block starting at `k0`.
#[inline(always)]
fn scale_at(v: &QuantView, r: usize, k0: usize) -> usize {
    let scale_row = if v.kind == QuantKind::Fp8Block {
        r / 32
    } else {
        r
    };
    scale_row * v.scale_cols + k0 / BLOCK
}

/// `Σ x[k] · e4m3(code[k])` over one block, exact in f64, so four partial sums are fine.
#[inline(always)]
fn fp8_block_sum(x: &[f64; BLOCK], codes: &[u8; BLOCK]) -> f64 {
    let mut p = [0f64; 4];
    for (xq, cq) in x.chunks_exact(4).zip(codes.chunks_exact(4)) {
        for l in 0..4 {
            p[l] += xq[l] * E4M3_F64[usize::from(cq[l])];
        }
    }
    (p[0] + p[1]) + (p[2] + p[3])
}

/// [`fp8_block_sum`] for packed FP4 (two e2m1 values per byte, low nibble first).
#[inline(always)]
fn fp4_block_sum(x: &[f64; BLOCK], codes: &[u8; BLOCK / 2]) -> f64 {
    let mut p = [0f64; 4];
    for (xq, cq) in x.chunks_exact(4).zip(codes.chunks_exact(2)) {
        let [a, b] = E2M1_PAIR_F64[usize::from(cq[0])];
        let [c, d] = E2M1_PAIR_F64[usize::from(cq[1])];
        p[0] += xq[0] * a;
        p[1] += xq[1] * b;
        p[2] += xq[2] * c;
        p[3] += xq[3] * d;
    }
    (p[0] + p[1]) + (p[2] + p[3])
}

/// C2 over one full block of FP8 codes for TILE consecutive rows (`base` starts at the
/// first row, rows `stride` bytes apart): `acc[i] += x[k] · (code · s[i])`, k increasing.
#[inline(always)]
fn fp8_block_c2(
    acc: &mut [f64; TILE],
    x: &[f64; BLOCK],
    base: &[u8],
    stride: usize,
    at: usize,
    s: &[f64; TILE],
    level: Level,
) {
    let rows: [&[u8; BLOCK]; TILE] =
        std::array::from_fn(|i| base[i * stride + at..][..BLOCK].try_into().expect("block"));
    for (k, &xk) in x.iter().enumerate() {
        for i in 0..TILE {
            acc[i] = madd(level, acc[i], xk, E4M3_F64[usize::from(rows[i][k])] * s[i]);
        }
    }
}

/// [`fp8_block_c2`] for packed FP4.
#[inline(always)]
fn fp4_block_c2(
    acc: &mut [f64; TILE],
    x: &[f64; BLOCK],
    base: &[u8],
    stride: usize,
    at: usize,
    s: &[f64; TILE],
    level: Level,
) {
    let rows: [&[u8; BLOCK / 2]; TILE] = std::array::from_fn(|i| {
        base[i * stride + at..][..BLOCK / 2]
            .try_into()
            .expect("half block")
    });
    for (j, xp) in x.chunks_exact(2).enumerate() {
        for i in 0..TILE {
            let [lo, hi] = E2M1_PAIR_F64[usize::from(rows[i][j])];
            acc[i] = madd(level, acc[i], xp[0], lo * s[i]);
            acc[i] = madd(level, acc[i], xp[1], hi * s[i]);
        }
    }
}

/// Input rows whose chains [`dot_rows`] advances together in a prefill: independent chains,
/// so the multiply-adds overlap instead of waiting on one chain's latency.
const GROUP: usize = 4;

/// With AVX-512, input rows whose chains `simd::avx512::dot_rows` advances together: one
/// register of eight weight rows' chains each, the input broadcast from memory into the
/// multiply-add (a third of the AVX2 loop's instructions per multiply-add). Sixteen chains
/// keep both multiply-add units busy through their latency, as in the machine's floor
/// measurement; eight left the kernel ~10% slower (measured).
const WIDE_GROUP: usize = 16;

/// The largest group [`row_groups`] may form at `level`: the baseline (SSE2) has too few
/// registers for GROUP rows' chains, AVX-512 room for WIDE_GROUP. Prefill tasks run the
/// AVX2 copy of the task body (see [`MatVec::task`]), which calls the AVX-512 kernel.
fn largest_group(level: Level) -> usize {
    if level < Level::Avx2 {
        1
    } else if cfg!(target_arch = "x86_64") && simd::level() >= Level::Avx512 {
        WIDE_GROUP
    } else {
        GROUP
    }
}

/// `(first row, count)` of the groups input rows `0..rows` are taken in: `largest` rows at a
/// time, the last group what is left.
fn row_groups(rows: usize, largest: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows)
        .step_by(largest)
        .map(move |m| (m, largest.min(rows - m)))
}

/// `acc[j][i] += x_j[k] · w[k][i]` for k in increasing order, for the input rows `x(j)`:
/// TILE independent f64 chains per input row.
#[inline(always)]
fn dot_rows<const R: usize>(
    acc: &mut [[f64; TILE]; R],
    xs: [&[f64]; R],
    w: &WeightBlock,
    level: Level,
) {
    let len = xs[0].len();
    if len == BLOCK {
        let xs: [&[f64; BLOCK]; R] = xs.map(|x| x.try_into().expect("full block"));
        for (k, wk) in w.iter().enumerate() {
            for j in 0..R {
                let xk = xs[j][k];
                for i in 0..TILE {
                    acc[j][i] = madd(level, acc[j][i], xk, wk[i]);
                }
            }
        }
    } else {
        for (k, wk) in w.iter().enumerate().take(len) {
            for j in 0..R {
                let xk = xs[j][k];
                for i in 0..TILE {
                    acc[j][i] = madd(level, acc[j][i], xk, wk[i]);
                }
            }
        }
    }
}

/// Input rows per task of [`output_rows_from_columns`]: each task writes that many rows of
/// `y` in order and reads half a cache line of each output's column.
const TRANSPOSE_ROWS: usize = 8;

/// A prefill's output-major results `yt[n · rows + m]` written to `y[m · y_stride + n]`.
/// Rows go to the pool in groups (a serial element-by-element transpose wrote a new cache
/// line of `y` per element and was a twentieth of a `wide` prefill, with the other thread
/// idle); a copy, so the bits do not depend on the split.
fn output_rows_from_columns(yt: &[f32], rows: usize, y: &mut [f32], y_stride: usize) {
    let n_out = yt.len() / rows;
    let parallel = worth_parallel(yt.len() * TRANSPOSE_ROWS);
    let y = &mut y[..(rows - 1) * y_stride + n_out];
    for_each_chunk(y, TRANSPOSE_ROWS * y_stride, parallel, |t, chunk| {
        let m0 = t * TRANSPOSE_ROWS;
        let present = (rows - m0).min(TRANSPOSE_ROWS);
        for (n, column) in yt.chunks_exact(rows).enumerate() {
            for (r, &v) in column[m0..m0 + present].iter().enumerate() {
                chunk[r * y_stride + n] = v;
            }
        }
    });
}

// Per-thread reusable buffers. They are taken out of the cell while in use, so a nested call
// (a linear inside a rayon task of another linear) finds an empty buffer instead of aliasing.
thread_local! {
    pub(crate) static INPUT_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    pub(crate) static WIDE_SCRATCH: Cell<Vec<f64>> = const { Cell::new(Vec::new()) };
    static OUTPUT_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static WEIGHT_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static ACC_SCRATCH: Cell<Vec<f64>> = const { Cell::new(Vec::new()) };
    static C1_SUM_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static ACT_BLOCK_SCRATCH: Cell<Vec<ActBlock>> = const { Cell::new(Vec::new()) };
    static BLOCKED_INPUT_SCRATCH: Cell<Vec<[f64; BLOCK]>> = const { Cell::new(Vec::new()) };
    static ACT_TILE_SCRATCH: Cell<ActTiles> = Cell::new(ActTiles::default());
    static ACT_DIGIT_SCRATCH: Cell<ActDigits> = Cell::new(ActDigits::default());
    static ACT_WORD_SCRATCH: Cell<ActWords> = Cell::new(ActWords::default());
    static ACT_PAIR_SCRATCH: Cell<ActWordBlocks> = Cell::new(ActWordBlocks::default());
    #[cfg(target_arch = "x86_64")]
    static INPUT_LANE_SCRATCH: Cell<simd::avx2::InputLanes> =
        Cell::new(simd::avx2::InputLanes::default());
    #[cfg(target_arch = "x86_64")]
    static INPUT_DIGIT_SCRATCH: Cell<simd::avx2_digits::NibbleInputs> =
        Cell::new(simd::avx2_digits::NibbleInputs::default());
    #[cfg(target_arch = "x86_64")]
    static INPUT_WORD_SCRATCH: Cell<simd::avx2_digits::ByteInputs> =
        Cell::new(simd::avx2_digits::ByteInputs::default());
    static WIDE_SCRATCH_BLOCK: Cell<Option<Box<WideBlock>>> = const { Cell::new(None) };
}

type Scratch<T> = std::thread::LocalKey<Cell<Vec<T>>>;

/// Take this thread's buffer, cleared, then filled with `len` copies of `fill`.
pub(crate) fn take<T: Copy>(key: &'static Scratch<T>, len: usize, fill: T) -> Vec<T> {
    let mut v = key.with(Cell::take);
    v.clear();
    v.resize(len, fill);
    v
}

/// Return a buffer (keeping the larger of the returned and any buffer stored meanwhile).
pub(crate) fn put<T>(key: &'static Scratch<T>, v: Vec<T>) {
    key.with(|c| {
        let old = c.take();
        c.set(if old.capacity() > v.capacity() {
            old
        } else {
            v
        });
    });
}
