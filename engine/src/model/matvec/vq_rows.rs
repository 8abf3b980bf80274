//! Single-row products on container VQ rows by the 32-row loops of `simd::vq`, where a
//! decode task is half an index band.

use super::{bf16, MatVec, Rule, BLOCK};
use crate::checkpoint::{VqView, VQ_WIDTH};
use crate::model::simd::vq::{
    vq_c1_run32, vq_c1_run32_avx2, vq_c2_run32, vq_c2_run32_avx2, VqRun, VQ_RUN_ROWS,
};
use crate::model::simd::Level;

impl MatVec<'_> {
    /// Outputs `first ..` (`out`) of a single-row product on VQ rows by the 32-row loops;
    /// `false`, nothing written, where they do not apply: a task of other rows than half an
    /// index band, columns that are not whole 32-blocks, a codebook format without a loop.
    ///
    /// Only called at [`Level::Avx512`] (inside `task_avx512`) or [`Level::Avx2`] (inside
    /// `task_avx2`), whose loops it runs.
    #[inline(always)]
    pub(super) fn vq_rows32(&self, v: VqView, first: usize, out: &mut [f32], level: Level) -> bool {
        let r0 = self.w_first + first;
        let Ok(out) = <&mut [f32; VQ_RUN_ROWS]>::try_from(out) else {
            return false;
        };
        if !r0.is_multiple_of(VQ_RUN_ROWS)
            || r0 + VQ_RUN_ROWS > v.rows
            || self.n_in != v.cols
            || self.n_in == 0
            || !self.n_in.is_multiple_of(BLOCK)
        {
            return false;
        }
        match (v.packed, v.stages) {
            (false, 3) => self.vq_run::<3, 256, false>(v, r0, out, level),
            (false, 4) => self.vq_run::<4, 256, false>(v, r0, out, level),
            (true, 4) => self.vq_run::<4, 64, true>(v, r0, out, level),
            _ => false,
        }
    }

    #[inline(always)]
    fn vq_run<const S: usize, const E: usize, const PACKED: bool>(
        &self,
        v: VqView,
        r0: usize,
        out: &mut [f32; VQ_RUN_ROWS],
        level: Level,
    ) -> bool {
        let Some(books) = v.books_as::<E, S>() else {
            return false;
        };
        let mut scales = [0f32; VQ_RUN_ROWS];
        for (i, s) in scales.iter_mut().enumerate() {
            *s = v.scale(r0 + i);
        }
        let rows = VqRun::<S, E, PACKED> {
            books,
            indices: v.indices,
            first: v.index_at(r0, 0),
            scales: &scales,
        };
        let x = &self.x[self.x_off..][..self.n_in];
        let blocks = self.n_in / BLOCK;
        match self.rule {
            Rule::C1 => {
                let mut acc = [0f32; VQ_RUN_ROWS];
                // SAFETY: only reached from `task_avx512` (Avx512) or `task_avx2`; the rows lie
                // in one band, whose indices the view holds, and `x` holds every block.
                unsafe {
                    if level >= Level::Avx512 {
                        vq_c1_run32(&mut acc, x, rows, 0..blocks);
                    } else {
                        vq_c1_run32_avx2(&mut acc, x, rows, 0..blocks);
                    }
                }
                *out = acc;
            }
            Rule::C2 { init } => {
                let mut acc = [init; VQ_RUN_ROWS];
                let vectors = 0..blocks * (BLOCK / VQ_WIDTH);
                // SAFETY: as above.
                unsafe {
                    if level >= Level::Avx512 {
                        vq_c2_run32(&mut acc, x, rows, vectors);
                    } else {
                        vq_c2_run32_avx2(&mut acc, x, rows, vectors);
                    }
                }
                for (o, a) in out.iter_mut().zip(acc) {
                    *o = a as f32;
                }
            }
        }
        if self.round_out {
            out.iter_mut().for_each(|o| *o = bf16(*o));
        }
        true
    }
}
