//! What this machine can do, measured in the same run as the model: read bandwidth (a plain
//! summing loop over a buffer far larger than the caches, on the current thread pool) and the
//! rate of f64 multiply-adds this build reaches (many independent chains, as the kernels run
//! them, at the vector width the build targets). Best of a few
//! repetitions, so a busy moment on a shared machine does not set the floor.

use std::time::Instant;

use ds41_engine::model::simd;
use rayon::prelude::*;

/// Bytes of the buffer the bandwidth loop reads.
const BANDWIDTH_BYTES: usize = 512 << 20;
const REPS: usize = 3;

/// Read bandwidth in bytes per second.
pub fn read_bandwidth() -> f64 {
    let words = BANDWIDTH_BYTES / 8;
    // Distinct values, so no page is shared and nothing is folded away.
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(rayon::current_num_threads().max(1) * 4);
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..REPS {
        let t = Instant::now();
        sink ^= buf
            .par_chunks(chunk)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u64::wrapping_add);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    BANDWIDTH_BYTES as f64 / best
}

/// f64 multiply-adds per second over all threads of the pool: enough independent chains
/// (several vector registers' worth) that the FMA units, not the latency of one chain, bound
/// the rate; at the vector level the kernels run with ([`simd::level`]).
pub fn multiply_add_rate() -> f64 {
    let threads = rayon::current_num_threads().max(1);
    let mut best = f64::INFINITY;
    for _ in 0..REPS {
        let t = Instant::now();
        let s: f64 = (0..threads)
            .into_par_iter()
            .map(|i| {
                let x = std::hint::black_box(1.000_000_1 + i as f64 * 1e-9);
                match simd::level() {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `level` reports Avx2 or above only where the CPU has AVX2 and FMA.
                    l if l >= simd::Level::Avx2 => unsafe { chains_fma(x) },
                    _ => chains::<false>(x),
                }
            })
            .sum();
        std::hint::black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (threads * CHAINS * STEPS) as f64 / best
}

const CHAINS: usize = 64;
const STEPS: usize = 1 << 21;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_fma(x: f64) -> f64 {
    chains::<true>(x)
}

#[inline(always)]
fn chains<const FUSED: bool>(x: f64) -> f64 {
    let mut acc = [0.0f64; CHAINS];
    for _ in 0..STEPS {
        for a in &mut acc {
            *a = if FUSED {
                a.mul_add(x, 1e-9)
            } else {
                *a * x + 1e-9
            };
        }
    }
    acc.iter().sum::<f64>()
}
