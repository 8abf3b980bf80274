//! VQ3R expert encoding (CONTAINER.md §4–§5): three residual stages of 256 eight-dimensional
//! f16 codewords per (layer, kind), shared by every expert of the layer, and one f16 scale per
//! output row.
//!
//! Fit: each row is divided by its RMS, cut into 8-column vectors; a deterministic sample of
//! them trains stage 0 by k-means, the residuals after stage 0 train stage 1, and so on.
//! Encoding is greedy per stage (nearest codeword of the remaining residual); the row scale is
//! then the least-squares scale of the row onto its decoded unit-scale vectors. Everything is
//! deterministic: the initial centroids come from a seeded SplitMix64 draw, every reduction
//! runs in a fixed order, and only the per-vector assignment (independent per vector) runs in
//! parallel, so the result does not depend on the thread count.

use ds41_synthetic::container::{ENTRIES, STAGES, VEC_DIM};
use ds41_synthetic::rng::SplitMix64;
use half::f16;
use rayon::prelude::*;

/// k-means settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VqParams {
    /// Lloyd iterations per stage.
    pub iters: usize,
    /// Training vectors per (layer, kind) at most (a strided sample beyond that).
    pub max_train: usize,
    pub seed: u64,
}

impl Default for VqParams {
    fn default() -> Self {
        VqParams {
            iters: 8,
            max_train: 1 << 16,
            seed: 0,
        }
    }
}

/// The stage codebooks of one (layer, kind): `STAGES` × `ENTRIES × VEC_DIM` values, each
/// exactly an f16 (what the container stores and the reader widens).
#[derive(Debug, Clone)]
pub struct Codebooks {
    pub stages: Vec<Vec<f32>>,
    norms: Vec<Vec<f32>>,
}

/// Squared norms of a codebook's codewords: a distance is then `|c|² − 2 c·v` (+ |v|², the
/// same for every codeword).
fn norms(book: &[f32]) -> Vec<f32> {
    book.chunks_exact(VEC_DIM)
        .map(|c| c.iter().map(|x| x * x).sum())
        .collect()
}

/// Index of the codeword of `book` (with its `norms`) nearest to `v` (ties to the lower index).
fn nearest(book: &[f32], norms: &[f32], v: &[f32]) -> usize {
    let v: &[f32; VEC_DIM] = v.try_into().expect("a vector of VEC_DIM values");
    let mut best = (f32::INFINITY, 0);
    for (i, (c, &n)) in book.chunks_exact(VEC_DIM).zip(norms).enumerate() {
        let c: &[f32; VEC_DIM] = c.try_into().expect("VEC_DIM values");
        let mut dot = 0f32;
        for t in 0..VEC_DIM {
            dot += c[t] * v[t];
        }
        let d = n - 2.0 * dot;
        if d < best.0 {
            best = (d, i);
        }
    }
    best.1
}

fn assign(book: &[f32], data: &[f32]) -> Vec<usize> {
    let n = norms(book);
    data.par_chunks(VEC_DIM * 256)
        .flat_map_iter(|chunk| chunk.chunks_exact(VEC_DIM).map(|v| nearest(book, &n, v)))
        .collect()
}

/// k-means of `data` (`n × VEC_DIM`) into `ENTRIES` centroids, rounded to f16 at the end.
/// Initial centroids: distinct sample positions from `rng` (all of them, then zeros, when
/// there are fewer vectors than entries). An emptied cluster keeps its centroid.
fn kmeans(data: &[f32], iters: usize, rng: &mut SplitMix64) -> Vec<f32> {
    let n = data.len() / VEC_DIM;
    let mut book = vec![0f32; ENTRIES * VEC_DIM];
    // Partial Fisher–Yates over the sample positions.
    let mut order: Vec<usize> = (0..n).collect();
    for i in 0..ENTRIES.min(n) {
        let j = i + rng.below((n - i) as u64) as usize;
        order.swap(i, j);
        book[i * VEC_DIM..(i + 1) * VEC_DIM]
            .copy_from_slice(&data[order[i] * VEC_DIM..(order[i] + 1) * VEC_DIM]);
    }
    for _ in 0..iters {
        let owner = assign(&book, data);
        let mut sum = vec![0f64; ENTRIES * VEC_DIM];
        let mut count = vec![0usize; ENTRIES];
        for (v, &k) in data.chunks_exact(VEC_DIM).zip(&owner) {
            count[k] += 1;
            for t in 0..VEC_DIM {
                sum[k * VEC_DIM + t] += f64::from(v[t]);
            }
        }
        for k in 0..ENTRIES {
            if count[k] > 0 {
                for t in 0..VEC_DIM {
                    book[k * VEC_DIM + t] = (sum[k * VEC_DIM + t] / count[k] as f64) as f32;
                }
            }
        }
    }
    book.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
}

impl Codebooks {
    /// Fit the stages to `train` (`n × VEC_DIM` unit-scale vectors). `key` names the (layer,
    /// kind) so each gets its own seeded stream.
    pub fn fit(train: &[f32], p: &VqParams, key: &str) -> Codebooks {
        let mut residual = train.to_vec();
        let mut stages = Vec::with_capacity(STAGES);
        for s in 0..STAGES {
            let mut rng = SplitMix64::for_object(p.seed, &format!("vq:{key}:stage{s}"));
            let book = kmeans(&residual, p.iters, &mut rng);
            let owner = assign(&book, &residual);
            for (v, &k) in residual.chunks_exact_mut(VEC_DIM).zip(&owner) {
                for t in 0..VEC_DIM {
                    v[t] -= book[k * VEC_DIM + t];
                }
            }
            stages.push(book);
        }
        Codebooks::new(stages)
    }

    /// Codebooks of given stage values.
    pub fn new(stages: Vec<Vec<f32>>) -> Codebooks {
        let norms = stages.iter().map(|b| norms(b)).collect();
        Codebooks { stages, norms }
    }

    /// Greedy residual encoding of one unit-scale vector; returns the stage indices and adds
    /// the decoded vector (Σ_s codeword) to `decoded`.
    pub fn encode(&self, v: &[f32], decoded: &mut [f32]) -> [u8; STAGES] {
        let mut r = [0f32; VEC_DIM];
        r.copy_from_slice(v);
        let mut idx = [0u8; STAGES];
        for (s, (book, n)) in self.stages.iter().zip(&self.norms).enumerate() {
            let k = nearest(book, n, &r);
            idx[s] = k as u8;
            for t in 0..VEC_DIM {
                r[t] -= book[k * VEC_DIM + t];
                decoded[t] += book[k * VEC_DIM + t];
            }
        }
        idx
    }

    /// The f16 bits of stage `s` (exact: the values are f16 already).
    pub fn f16_bits(&self, s: usize) -> Vec<u16> {
        self.stages[s]
            .iter()
            .map(|&x| f16::from_f32(x).to_bits())
            .collect()
    }
}

/// RMS of a row (0 for an all-zero row).
pub fn row_rms(row: &[f32]) -> f32 {
    let ss: f64 = row.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    (ss / row.len().max(1) as f64).sqrt() as f32
}

/// One matrix `[m, n]` encoded: `idx[stage][row · (n/8) + vector]` and the f16 row scales.
pub struct EncodedMatrix {
    pub idx: Vec<Vec<u8>>,
    pub scales: Vec<u16>,
}

/// Encode `w` (`m × n`, row-major) with `books`.
pub fn encode_matrix(books: &Codebooks, w: &[f32], n: usize) -> EncodedMatrix {
    let m = w.len() / n;
    let nv = n / VEC_DIM;
    let rows: Vec<(Vec<[u8; STAGES]>, u16)> = w
        .par_chunks(n)
        .map(|row| {
            let rms = row_rms(row);
            if rms == 0.0 {
                return (vec![[0; STAGES]; nv], 0);
            }
            let mut decoded = vec![0f32; n];
            let mut unit = [0f32; VEC_DIM];
            let idx: Vec<[u8; STAGES]> = (0..nv)
                .map(|v| {
                    for t in 0..VEC_DIM {
                        unit[t] = row[v * VEC_DIM + t] / rms;
                    }
                    books.encode(&unit, &mut decoded[v * VEC_DIM..(v + 1) * VEC_DIM])
                })
                .collect();
            // Least-squares row scale onto the decoded unit-scale row.
            let (num, den) = row
                .iter()
                .zip(&decoded)
                .fold((0f64, 0f64), |(a, b), (&x, &q)| {
                    (
                        a + f64::from(x) * f64::from(q),
                        b + f64::from(q) * f64::from(q),
                    )
                });
            let scale = if den > 0.0 { num / den } else { 0.0 };
            (idx, f16::from_f64(scale).to_bits())
        })
        .collect();
    let mut idx = vec![vec![0u8; m * nv]; STAGES];
    let mut scales = Vec::with_capacity(m);
    for (r, (row_idx, scale)) in rows.into_iter().enumerate() {
        for (v, st) in row_idx.iter().enumerate() {
            for s in 0..STAGES {
                idx[s][r * nv + v] = st[s];
            }
        }
        scales.push(scale);
    }
    EncodedMatrix { idx, scales }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n * VEC_DIM)
            .map(|_| r.uniform(-1.0, 1.0) as f32)
            .collect()
    }

    #[test]
    fn fit_is_deterministic_and_thread_count_independent() {
        let train = data(3000, 7);
        let p = VqParams {
            iters: 4,
            ..VqParams::default()
        };
        let a = Codebooks::fit(&train, &p, "L0.k0");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let b = pool.install(|| Codebooks::fit(&train, &p, "L0.k0"));
        assert_eq!(a.stages, b.stages);
        let c = Codebooks::fit(&train, &VqParams { seed: 1, ..p }, "L0.k0");
        assert_ne!(a.stages, c.stages);
    }

    #[test]
    fn residual_stages_reduce_the_error() {
        let w = data(512, 3); // 64 rows of 64 columns
        let books = Codebooks::fit(&w, &VqParams::default(), "t");
        let err_after = |stages: usize| {
            let part = Codebooks::new(books.stages[..stages].to_vec());
            let mut d = 0f64;
            for v in w.chunks_exact(VEC_DIM) {
                let mut dec = [0f32; VEC_DIM];
                part.encode(v, &mut dec);
                d += v
                    .iter()
                    .zip(&dec)
                    .map(|(a, b)| f64::from(a - b).powi(2))
                    .sum::<f64>();
            }
            d
        };
        let (e1, e2, e3) = (err_after(1), err_after(2), err_after(3));
        assert!(e1 > e2 && e2 > e3, "{e1} {e2} {e3}");
        let enc = encode_matrix(&books, &w, 64);
        assert_eq!(
            (enc.idx.len(), enc.idx[0].len(), enc.scales.len()),
            (3, 64 * 8, 64)
        );
    }
}
